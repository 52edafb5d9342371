"""The desktop app's menu-bar icon on a real X display: a system tray (trayer) on Xvfb shows
Perch's icon; a click opens its menu; the keyboard picks the second model, which the engine
then loads; Quit ends the app. Screens are read back with xwd. Run by
src-tauri/tests/app_window.rs inside `xvfb-run dbus-run-session`.

Usage: python3 tray.py APP_BINARY PORT ARTIFACT_DIR   (settings come from $PERCH_CONFIG)
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

app, port, artifacts = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(artifacts, exist_ok=True)
base = f"http://127.0.0.1:{port}"


def step(s):
    print(f"[tray] {s}", flush=True)


def get(path):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return json.load(r)


def until(what, fn, timeout=60):
    t = time.time()
    while True:
        try:
            v = fn()
            if v:
                return v
        except OSError:
            pass
        if time.time() - t > timeout:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def screen(name=None):
    """The root window as (width, height, rows of (r, g, b))."""
    xwd = subprocess.run(["xwd", "-root", "-silent"], check=True, capture_output=True).stdout
    ppm = subprocess.run(["convert", "xwd:-", "ppm:-"], input=xwd, check=True, capture_output=True).stdout
    if name:
        subprocess.run(["convert", "xwd:-", os.path.join(artifacts, name)], input=xwd, check=True)
    # Binary PPM: "P6", width, height, maxval (with "#" comment lines between), then RGB.
    fields, pos = [], 0
    while len(fields) < 4:
        end = ppm.index(b"\n", pos)
        line = ppm[pos:end]
        pos = end + 1
        if not line.startswith(b"#"):
            fields += line.split()
    w, h = int(fields[1]), int(fields[2])
    return w, h, ppm[pos:]


def pixel(img, x, y):
    w, _, data = img
    i = 3 * (y * w + x)
    return data[i], data[i + 1], data[i + 2]


tray = subprocess.Popen(["trayer", "--edge", "top", "--align", "right", "--widthtype", "pixel", "--width", "120", "--height", "32", "--transparent", "false"])
time.sleep(1.5)
env = dict(os.environ, PERCH_NO_WINDOW="1")
proc = subprocess.Popen([app], env=env)
try:
    until("the engine", lambda: get("/perch/status")["phase"] == "running")
    step("the app's engine runs")
    time.sleep(1)  # the tray follows the engine within 250 ms

    # The icon: dark pixels on the tray's light bar, top right.
    def icon():
        img = screen()
        w = img[0]
        dark = [(x, y) for y in range(2, 30) for x in range(w - 120, w) if sum(pixel(img, x, y)) < 200]
        return len(dark) > 30 and dark

    dark = until("the tray icon", icon, timeout=30)
    cx = sum(x for x, _ in dark) // len(dark)
    cy = sum(y for _, y in dark) // len(dark)
    screen("tray-icon.png")
    step(f"the icon is drawn in the tray at ({cx}, {cy}), {len(dark)} dark pixels")

    def menu_open():
        img = screen()
        w = img[0]
        light = sum(1 for y in range(40, 180, 4) for x in range(w - 320, w, 4) if sum(pixel(img, x, y)) > 600)
        return light > 200

    assert not menu_open(), "no menu before the click"
    subprocess.run(["xdotool", "mousemove", str(cx), str(cy), "click", "1"], check=True)
    until("the menu", menu_open, timeout=10)
    screen("tray-menu.png")
    step("a click opens the menu")

    # Keyboard: the status line is disabled, so Down lands on the first model, Down again on
    # the second; Return picks it.
    subprocess.run(["xdotool", "key", "--delay", "150", "Down", "Down", "Return"], check=True)
    until("the picked model to load", lambda: get("/health")["model"]["id"] == "mtp", timeout=30)
    assert get("/perch/status")["default_model"] == "mtp"
    step("picking the second model in the menu loaded it")

    time.sleep(1)  # let the tray take the rebuilt menu (the check moved)

    def click_open():
        subprocess.run(["xdotool", "mousemove", str(cx), str(cy), "click", "1"], check=True)
        time.sleep(0.5)
        return menu_open()

    until("the menu again", click_open, timeout=10)
    screen("tray-menu-picked.png")
    # Quit is the last item.
    subprocess.run(["xdotool", "key", "--delay", "150", "End", "Return"], check=True)
    code = proc.wait(timeout=30)
    assert code == 0, f"the app exited with {code}"
    try:
        get("/health")
        raise SystemExit("the engine still answers after Quit")
    except OSError:
        pass
    step("Quit drained the engine and ended the app")
    print("[tray] the menu-bar icon works", flush=True)
finally:
    if proc.poll() is None:
        proc.kill()
    tray.kill()

#!/usr/bin/env python3
"""Draw Perch's icons (a bird perched on a branch) into icons/: app icons in the sizes Tauri
bundles, and a monochrome tray template for the macOS menu bar. Needs Pillow."""

from pathlib import Path

from PIL import Image, ImageDraw

OUT = Path(__file__).resolve().parent.parent / "icons"


def bird(size: int, fg, bg) -> Image.Image:
    s = size / 64.0
    img = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    d = ImageDraw.Draw(img)
    if bg:
        d.rounded_rectangle([0, 0, size - 1, size - 1], radius=14 * s, fill=bg)
    d.ellipse([18 * s, 20 * s, 44 * s, 44 * s], fill=fg)            # body
    d.ellipse([34 * s, 12 * s, 50 * s, 28 * s], fill=fg)            # head
    d.polygon([(49 * s, 18 * s), (57 * s, 21 * s), (49 * s, 24 * s)], fill=fg)  # beak
    d.polygon([(20 * s, 34 * s), (6 * s, 44 * s), (22 * s, 42 * s)], fill=fg)   # tail
    d.rounded_rectangle([8 * s, 47 * s, 56 * s, 51 * s], radius=2 * s, fill=fg)  # branch
    d.line([(30 * s, 43 * s), (28 * s, 48 * s)], fill=fg, width=max(1, int(2 * s)))
    d.line([(36 * s, 43 * s), (38 * s, 48 * s)], fill=fg, width=max(1, int(2 * s)))
    if bg:
        d.ellipse([41 * s, 17 * s, 44 * s, 20 * s], fill=bg)       # eye
    return img


def main() -> None:
    OUT.mkdir(exist_ok=True)
    teal, white = (18, 94, 104, 255), (255, 255, 255, 255)
    for px in (32, 128, 256, 512):
        bird(px, white, teal).save(OUT / f"{px}x{px}.png")
    bird(512, white, teal).save(OUT / "icon.png")
    bird(256, white, teal).save(OUT / "128x128@2x.png")
    bird(512, white, teal).save(OUT / "icon.icns")
    bird(256, white, teal).save(OUT / "icon.ico", sizes=[(16, 16), (32, 32), (48, 48), (256, 256)])
    # macOS menu-bar template: black on transparent, the system tints it.
    bird(44, (0, 0, 0, 255), None).save(OUT / "tray-template.png")
    bird(44, (0, 0, 0, 255), None).resize((22, 22), Image.LANCZOS).save(OUT / "tray-template-22.png")


if __name__ == "__main__":
    main()

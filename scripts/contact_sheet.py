"""Every committed figure on one page, so that their quality can be seen at a glance: the PNGs
under ``figures/`` (those git tracks; the git-ignored ``figures/smoke/`` is not among them) tiled
into ``docs/contact_sheet.png``, each tile labelled with its file name and with what drew it.

``fairfl.studies.plotting.save_figure`` stamps every PNG it writes with the print style it drew in and with
what ``fairfl.base.figure_checks.problems`` found. A tile says

    new code, <size>, checks ok        drawn in the print style, fit for print (green)
    new code, <size>: <problem>        drawn in the print style, one of its problems (orange)
    old code                           no stamp: drawn before the print style; its notebook's run
                                       re-renders it (red)

    .venv/bin/python scripts/contact_sheet.py                 # figures/*.png -> docs/contact_sheet.png
    .venv/bin/python scripts/contact_sheet.py --figures DIR --out sheet.png [--columns 4] [--tile 520]
    .venv/bin/python scripts/contact_sheet.py --smoke --out sheet.png   # CI: two figures drawn here, seconds

Prints one line per figure and a count of new and old ones.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fairfl.studies.plotting import figure_stamp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
COLOURS = {"new": (0, 120, 60), "problems": (200, 110, 0), "old": (190, 30, 30)}


def committed_figures(folder: Path) -> list[Path]:
    """The PNGs git tracks directly under ``folder`` (every PNG there when it is not in a git work tree)."""
    try:
        out = subprocess.run(["git", "ls-files", "--", "*.png"], cwd=folder, capture_output=True, text=True,
                             check=True).stdout.split()
        tracked = [folder / p for p in out if "/" not in p]
    except (OSError, subprocess.CalledProcessError):
        tracked = []
    return sorted(tracked) or sorted(folder.glob("*.png"))


def label(path: Path) -> tuple[str, str]:
    """(kind, text) of a figure: kind "new", "problems" or "old", as the module's docstring says."""
    stamp = figure_stamp(path)
    if "fairfl-style" not in stamp:
        return "old", "old code (no print-style stamp)"
    size = stamp.get("fairfl-size", "size not recorded")
    checks = stamp.get("fairfl-checks", "not checked")
    if checks == "ok":
        return "new", f"new code ({stamp['fairfl-style']}), {size}, checks ok"
    return "problems", f"new code ({stamp['fairfl-style']}), {size}: {checks}"


def _font(size: int):
    from matplotlib import font_manager
    from PIL import ImageFont
    return ImageFont.truetype(font_manager.findfont("DejaVu Sans"), size)


def _wrapped(draw, text: str, font, width: int) -> list[str]:
    lines, current = [], ""
    for word in text.split(" "):
        trial = f"{current} {word}" if current else word
        if current and draw.textlength(trial, font=font) > width:
            lines.append(current)
            current = word
        else:
            current = trial
    return lines + [current]


def sheet(paths: list[Path], columns: int = 4, tile: int = 520):
    """The contact sheet (a PIL image) of ``paths`` and each figure's (name, kind, text)."""
    from PIL import Image, ImageDraw
    name_font, note_font = _font(15), _font(13)
    pad, text_h = 12, 78
    thumb_h = int(tile * 0.72)
    rows = -(-len(paths) // columns)
    out = Image.new("RGB", (columns * (tile + pad) + pad, rows * (thumb_h + text_h + pad) + pad), "white")
    draw = ImageDraw.Draw(out)
    labels = []
    for i, path in enumerate(paths):
        x = pad + (i % columns) * (tile + pad)
        y = pad + (i // columns) * (thumb_h + text_h + pad)
        with Image.open(path) as image:
            thumb = image.convert("RGB")
            thumb.thumbnail((tile, thumb_h), Image.LANCZOS)
        out.paste(thumb, (x + (tile - thumb.width) // 2, y + (thumb_h - thumb.height) // 2))
        draw.rectangle((x - 1, y - 1, x + tile, y + thumb_h), outline=(200, 200, 200))
        kind, text = label(path)
        labels.append((path.name, kind, text))
        draw.text((x, y + thumb_h + 4), path.name, fill="black", font=name_font)
        for j, line in enumerate(_wrapped(draw, text, note_font, tile)[:3]):
            draw.text((x, y + thumb_h + 24 + 17 * j), line, fill=COLOURS[kind], font=note_font)
    return out, labels


def _smoke_figures(folder: Path) -> list[Path]:
    """Two small figures: one through save_figure in the print style, one by plain matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fairfl.studies import plotting
    with matplotlib.rc_context():
        plotting.use_style()
        fig, ax = plotting.figure(width=plotting.ONE_COLUMN, height=2.2)
        ax.plot([0, 1, 2], [20, 60, 80], label="FedAvg", **plotting.method_styles(["FedAvg"])["FedAvg"])
        ax.set_xlabel("round")
        ax.set_ylabel("accuracy (%)")
        plotting.round_axis(ax)
        plotting.percent_axis(ax)
        plotting.figure_legend(fig)
        plotting.save_figure(fig, "new_style", folder)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(12, 4))
    ax.plot([0, 1, 2], [0.2, 0.6, 0.8])
    fig.savefig(folder / "old_style.png", dpi=60)
    plt.close(fig)
    return sorted(folder.glob("*.png"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--figures", type=Path, default=REPO / "figures", help="the folder of PNGs (default: figures/)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "contact_sheet.png")
    ap.add_argument("--columns", type=int, default=4)
    ap.add_argument("--tile", type=int, default=520, help="a tile's width in pixels")
    ap.add_argument("--smoke", action="store_true", help="CI: tile two figures drawn here (one new, one old)")
    args = ap.parse_args(argv)
    if args.columns < 1 or args.tile < 100:
        ap.error("--columns must be >= 1 and --tile >= 100")
    with tempfile.TemporaryDirectory() as tmp:
        paths = _smoke_figures(Path(tmp)) if args.smoke else committed_figures(args.figures)
        if not paths:
            ap.error(f"no PNG figures in {args.figures}")
        image, labels = sheet(paths, args.columns, args.tile)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # 256 colours, no dithering: thumbnails of plots lose nothing visible, the file a quarter of its RGB size
    from PIL import Image
    image.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE).save(args.out, optimize=True)
    for name, kind, text in labels:
        print(f"{name}: {text}")
    new = sum(kind != "old" for _, kind, _ in labels)
    print(f"{len(labels)} figures: {new} drawn by the new code ({sum(k == 'new' for _, k, _ in labels)} fit for print), "
          f"{len(labels) - new} by old code -> {args.out}")


if __name__ == "__main__":
    main()

"""Your own model on your own folder of images: capture → save → labels → reconstruct → PSNR.

The model is a plain ``nn.Module`` that gi's zoo does not know: a LeNet-sized sigmoid CNN (the DLG LeNet's
convolutions) with a BatchNorm layer and a head named ``head.out``. No input normalisation is added: what the
module computes is what is attacked (put a normalisation layer in your module if your data needs one).

The capture records how to rebuild the model in another process (the import string
``examples.own_model_folder:make_net`` plus its JSON keyword arguments) and the last layer's name. Loading it
back never imports what the file names on its own word: the reader passes the factory
(``gi.Capture.load(path, factory=make_net)``, ``gi attack CAPTURE model=examples.own_model_folder:make_net``).

Run from the repository root (``PYTHONPATH=.`` makes ``examples`` importable)::

    PYTHONPATH=. python examples/own_model_folder.py                 # writes PNGs of cifar10-samples, 5 images
    PYTHONPATH=. python examples/own_model_folder.py --root MY_IMAGES --size 32 --images 5 --iterations 3000

``--root`` is a torchvision ImageFolder layout (``root/<class>/<image>.png``) or a flat folder with
``labels.csv`` (``file,label``); ``--size`` resizes every image.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import torch
from torch import nn


class SmallCNN(nn.Module):
    """conv5×5/2 → BN → sigmoid → conv5×5/2 → sigmoid → conv5×5 → sigmoid → flatten → head.out (Linear)."""

    def __init__(self, channels: int = 3, num_classes: int = 10, size: int = 32, width: int = 12,
                 normalize: bool = False) -> None:
        super().__init__()
        self.normalize = normalize
        self.body = nn.Sequential(
            nn.Conv2d(channels, width, 5, padding=2, stride=2), nn.BatchNorm2d(width), nn.Sigmoid(),
            nn.Conv2d(width, width, 5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(width, width, 5, padding=2, stride=1), nn.Sigmoid(),
            nn.Flatten(),
        )
        side = -(-size // 4)
        self.head = nn.Sequential(collections.OrderedDict(out=nn.Linear(width * side * side, num_classes)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize:  # the model's own input normalisation: gi adds none to a user module
            x = (x - 0.5) / 0.25
        return self.head(self.body(x))


def make_net(channels: int = 3, num_classes: int = 10, size: int = 32, seed: int = 0,
             normalize: bool = False) -> SmallCNN:
    """The factory a capture records: same arguments, same architecture (weights come from the capture).
    DLG's initialisation U(−0.5, 0.5) on the convolutions and the head, seeded; BatchNorm keeps its own."""
    gen = torch.Generator().manual_seed(seed)
    net = SmallCNN(channels, num_classes, size, normalize=normalize)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                for p in m.parameters():
                    p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    return net


def write_pngs(folder: Path, count: int) -> Path:
    """``count`` CIFAR-10 sample images as PNG files in ImageFolder layout (``folder/<class>/<i>.png``)."""
    from PIL import Image

    from gi.world.data import load

    data = load("cifar10-samples")
    for i in range(count):
        cls = data.classes[int(data.labels[i])]
        (folder / cls).mkdir(parents=True, exist_ok=True)
        pixels = (data.images[i].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / cls / f"{i:03d}.png")
    return folder


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", help="a folder of images (default: write cifar10-samples PNGs)")
    parser.add_argument("--size", type=int, default=32, help="resize every image to size × size")
    parser.add_argument("--images", type=int, default=5, help="captures (one image each) to attack")
    parser.add_argument("--iterations", type=int, help="of the default preset (L-BFGS; default: the preset's)")
    parser.add_argument("--out", help="where the captures go (default: a temporary folder)")
    parser.add_argument("--mode", choices=("eval", "train"), default="eval", help="BatchNorm mode (protocol)")
    parser.add_argument("--normalize", action="store_true", help="the model maps pixels to (x − 0.5)/0.25 first")
    args = parser.parse_args(argv)

    import gi
    import labels
    from gi.analysis.metrics import psnr
    from gi.attack.recon import ReconConfig, reconstruct_many
    from gi.world.data import load
    from gi.world.models import from_factory

    work = Path(args.out or tempfile.mkdtemp(prefix="gi-own-model-"))
    root = Path(args.root) if args.root else write_pngs(work / "images", args.images)
    data = load("folder", root=str(root), size=args.size)
    channels = int(data.images.shape[1])
    model = from_factory("examples.own_model_folder:make_net", channels=channels, num_classes=data.num_classes,
                         size=args.size, seed=0, normalize=args.normalize)
    protocol = gi.Protocol(model_mode=args.mode)
    captures, results, truths = [], [], []
    for i in range(min(args.images, len(data))):
        capture, truth = gi.capture_gradients(model, data.images[i:i + 1], data.labels[i:i + 1], protocol)
        path = work / f"capture-{i}.safetensors"
        capture.save(path)
        captures.append(gi.Capture.load(path, factory=make_net))  # what another process would read, rebuilt
                                                                   # by our factory (never the file's own word)
        results.append(labels.recover(captures[-1], "auto"))  # one sample: the soft-label search (gi run's default)
        truths.append(truth)
    # every capture of the one global model in one batched problem (as gi run packs its images), + features
    keys = {"iterations": args.iterations} if args.iterations else {}
    cfg = ReconConfig.from_preset("default", progress=False, **keys)
    rows = []
    recs = reconstruct_many(captures, results, config=cfg)
    for i, (truth, result, rec) in enumerate(zip(truths, results, recs)):
        rows.append({"image": i, "label": int(truth.labels[0]), "recovered": result.labels.tolist(),
                     "psnr": float(psnr(rec.images.clamp(0, 1), truth.images).mean())})
        print(json.dumps(rows[-1]))
    capture = captures[-1]
    values = torch.tensor([r["psnr"] for r in rows])
    summary = {"last_layer": capture.last_layer_name, "factory": capture.model_spec["factory"],
               "labels_exact": all(r["recovered"] == [r["label"]] for r in rows),
               "psnr_mean": float(values.mean()), "psnr_median": float(values.median()),
               "psnr_min": float(values.min()), "images": len(rows), "captures": str(work)}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()

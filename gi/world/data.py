"""Real images offline, label augmentation and seeded sampling (docs/architecture.md, "Data flow", "Conventions").

Datasets (:func:`load`) are pixel tensors in [0, 1] of shape ``(N, C, H, W)``; normalisation is the
model's first layer, never the data's. Sources, all offline (nothing downloads, ever):

- ``<set>-samples``: foolbox's 20 bundled real test images each of CIFAR-10, CIFAR-100, MNIST,
  Fashion-MNIST and ImageNet (label in the file name ``<set>_<index>_<label>.png``);
- ``fashion-mnist``: the full 60k/10k Fashion-MNIST from Debian's ``dataset-fashion-mnist`` IDX files;
- ``cifar10``, ``cifar100``, ``mnist``, ``svhn`` (and ``fashion-mnist`` with ``root=``): a torchvision
  dataset folder the user points to with ``root=`` (read with ``download=False``).

Label augmentation follows the papers' own conventions, named explicitly:
``smoothing`` is the soft-label paper's ``(1−ε)·onehot + ε/C`` (Wang, Liang & He 2024, §4.1);
``smoothing-alt`` is the posterior paper's ``y⁺ = 1−ε, y⁻ = ε/(C−1)`` (§3.2);
``mixup`` is ``x = (1−λ)·x₁ + λ·x₂`` with the matching soft label (Zhang et al. 2018, as used by the
soft-label paper). Sampling helpers take a ``torch.Generator`` so every draw is reproducible.
"""

from __future__ import annotations

import gzip
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from gi.core.errors import AssetError, ConfigError
from gi.world import assets
from gi.world.classes import CIFAR10_CLASSES, CIFAR100_CLASSES, DIGITS, FASHION_CLASSES, imagenet_classes
from gi.world.models import MAX_CLASSES

Tensor = torch.Tensor
Size = int | tuple[int, int] | None

__all__ = [
    "DATASETS",
    "TARGET_KINDS",
    "ImageDataset",
    "class_imbalanced_batch",
    "class_names",
    "load",
    "make_targets",
    "mixup",
    "onehot",
    "sample_aux",
    "sample_batch",
    "sample_mixup_class_pairs",
    "sample_mixup_pairs",
    "smooth_labels",
    "to_batch",
]

# --------------------------------------------------------------------------------------------- dataset


class ImageDataset(Dataset):
    """Images ``(N, C, H, W)`` in [0, 1] with labels ``(N,)`` long; ``dataset[i]`` is ``(image, label)``.

    The one image-set type: a victim's data, a loaded dataset and the attacker's auxiliary data (``aux=`` of
    :func:`labels.recover`) alike. Floating images keep their dtype (float64 aux sets stay exact); others become
    float32.
    """

    def __init__(self, images: Tensor, labels: Tensor, num_classes: int, name: str = "",
                 classes: list[str] | None = None, split: str = "test") -> None:
        if images.ndim != 4 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
            raise ConfigError(f"dataset {name!r}: need images (N, C, H, W) and labels (N,), "
                              f"got {tuple(images.shape)} and {tuple(labels.shape)}")
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise ConfigError(f"dataset {name!r}: labels must lie in [0, {num_classes}), "
                              f"got [{int(labels.min())}, {int(labels.max())}]")
        self.images = images if images.is_floating_point() else images.float()
        self.labels = labels.long()
        self.num_classes = int(num_classes)
        self.name = name
        self.classes = list(classes) if classes is not None else []
        self.split = split

    def __len__(self) -> int:
        return self.labels.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.images[index], self.labels[index]

    def __repr__(self) -> str:
        return (f"ImageDataset(name={self.name!r}, split={self.split!r}, n={len(self)}, "
                f"shape={tuple(self.image_shape)}, num_classes={self.num_classes})")

    def of_class(self, c: int) -> Tensor:
        """The images of class ``c``."""
        return self.images[self.labels == c]

    @property
    def per_class(self) -> Tensor:
        """Samples per class, (C,)."""
        return torch.bincount(self.labels, minlength=self.num_classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])  # type: ignore[return-value]

    @property
    def counts(self) -> Tensor:
        """Samples per class, ``(num_classes,)``."""
        return torch.bincount(self.labels, minlength=self.num_classes)

    def subset(self, indices: Tensor | Sequence[int]) -> ImageDataset:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return ImageDataset(self.images[idx], self.labels[idx], self.num_classes, self.name, self.classes,
                            self.split)


@dataclass(frozen=True)
class _Source:
    """How to read one dataset: ``read(split, root) -> (uint8 images (N, C, H, W), labels (N,))``."""

    read: Callable[[str, Any], tuple[Tensor, Tensor]]
    splits: tuple[str, ...]
    num_classes: int
    classes: Callable[[], list[str]]
    default_size: int | None = None
    summary: str = ""
    takes_root: bool = False
    # a user's folder: ``read(split, root, size) -> (images, labels, class names)``, any class count and size
    read_folder: Callable[[str, Any, Any], tuple[Tensor, Tensor, list[str]]] | None = None


# foolbox samples ------------------------------------------------------------------------------------

_SAMPLE_FILE = re.compile(r"^(?P<set>[A-Za-z0-9]+)_(?P<index>\d+)_(?P<label>\d+)\.(?:png|jpg|jpeg)$")


def _center_square(img: Any) -> Any:
    w, h = img.size
    s = min(w, h)
    left, top = (w - s) // 2, (h - s) // 2
    return img.crop((left, top, left + s, top + s))


@cache
def _read_samples(prefix: str, grey: bool) -> tuple[Tensor, Tensor]:
    """Decode foolbox's ``<prefix>_<i>_<label>`` files in index order (cached per process)."""
    from PIL import Image

    folder = assets.foolbox_samples_dir()
    found = []
    for path in folder.iterdir():
        m = _SAMPLE_FILE.match(path.name)
        if m and m["set"] == prefix:
            found.append((int(m["index"]), int(m["label"]), path))
    if not found:
        raise AssetError(f"no {prefix}_<index>_<label> images in {folder}; reinstall foolbox: "
                         "pip install --no-deps --force-reinstall foolbox==3.3.4")
    found.sort()
    arrays = []
    for _, _, path in found:
        with Image.open(path) as img:
            img = img.convert("L" if grey else "RGB")
            if img.size[0] != img.size[1]:
                img = _center_square(img)  # one ImageNet sample is 1024×683: crop, never distort
            if arrays and img.size != arrays[0].shape[:2][::-1]:
                img = img.resize(arrays[0].shape[:2][::-1], Image.Resampling.BILINEAR)
            arrays.append(np.asarray(img, dtype=np.uint8).reshape(img.size[1], img.size[0], -1))
    images = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    labels = torch.tensor([label for _, label, _ in found], dtype=torch.long)
    return images, labels


def _samples_source(prefix: str, grey: bool) -> Callable[[str, Any], tuple[Tensor, Tensor]]:
    return lambda split, root: _read_samples(prefix, grey)


# IDX files (MNIST format) ---------------------------------------------------------------------------


@cache
def _read_idx(path: Path) -> Tensor:
    """Parse a (gzipped) IDX file of unsigned bytes: big-endian magic ``0x0000 08 nd``, dims, then data."""
    if not path.is_file():
        raise AssetError(f"IDX file {path} is missing; run `make install` (or apt-get install dataset-fashion-mnist)")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise AssetError(f"cannot read {path} ({exc}); reinstall it (`make install`)") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise AssetError(f"{path} is not an unsigned-byte IDX file; reinstall it (`make install`)")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise AssetError(f"{path} is truncated ({data.size} bytes for dims {dims}); reinstall it (`make install`)")
    return torch.from_numpy(data.reshape(dims).copy())


def _read_fashion_mnist(split: str, root: Any) -> tuple[Tensor, Tensor]:
    if root is not None:
        return _read_torchvision("FashionMNIST", "fashion-mnist", split, root)
    folder = assets.fashion_mnist_dir()
    stem = "train" if split == "train" else "t10k"
    images = _read_idx(folder / f"{stem}-images-idx3-ubyte.gz").unsqueeze(1)
    labels = _read_idx(folder / f"{stem}-labels-idx1-ubyte.gz").long()
    return images, labels


# torchvision roots ----------------------------------------------------------------------------------


def _read_torchvision(cls_name: str, name: str, split: str, root: Any) -> tuple[Tensor, Tensor]:
    import torchvision.datasets as tvd

    if root is None:
        raise AssetError(f"dataset {name!r} needs root=<folder with the torchvision {cls_name} layout> "
                         f"(nothing downloads at run time; fetch it once with torchvision.datasets.{cls_name}"
                         "(root, download=True) on a machine with internet)")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise AssetError(f"dataset {name!r}: root={str(root)!r} is not a folder; pass root= the folder that holds "
                         f"torchvision's {cls_name} files")
    cls = getattr(tvd, cls_name)
    kwargs = {"split": split} if cls_name == "SVHN" else {"train": split == "train"}
    try:
        ds = cls(str(root), download=False, **kwargs)
    except (RuntimeError, FileNotFoundError, OSError) as exc:
        raise AssetError(f"dataset {name!r} not found under root={str(root)!r} ({exc}); pass root= the folder "
                         f"holding torchvision's {cls_name} files") from None
    data = ds.data
    images = torch.as_tensor(np.asarray(data), dtype=torch.uint8)
    if images.ndim == 3:  # MNIST-like (N, H, W)
        images = images.unsqueeze(1)
    elif cls_name != "SVHN":  # CIFAR stores (N, H, W, C); SVHN already (N, C, H, W)
        images = images.permute(0, 3, 1, 2)
    labels = torch.as_tensor(np.asarray(ds.labels if cls_name == "SVHN" else ds.targets), dtype=torch.long)
    return images.contiguous(), labels


def _torchvision_source(cls_name: str, name: str) -> Callable[[str, Any], tuple[Tensor, Tensor]]:
    return lambda split, root: _read_torchvision(cls_name, name, split, root)


# a user's folder of images ---------------------------------------------------------------------------

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
MAX_PIXELS = 50_000_000  # one image of a folder: 7000 × 7000; its header is read before its pixels
LABELS_CSV = "labels.csv"
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N")
_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")  # a label that reads as a number


def _eight_bit(img: Any) -> Any:
    """A 16-bit grey image (modes ``I;16*``; a PNG's ``I``) as 8-bit ``L``, scaled by 255/65535: Pillow's own
    ``convert("L")`` clips such values at 255, which turns the image white. Other images pass unchanged."""
    from PIL import Image

    if img.mode not in _SIXTEEN_BIT and not (img.mode == "I" and img.format == "PNG"):
        return img.copy()
    values = np.asarray(img).astype(np.float64)
    return Image.fromarray(np.clip(np.rint(values * (255.0 / 65535.0)), 0, 255).astype(np.uint8), "L")


def _folder_files(root: Path) -> tuple[list[tuple[Path, str]], bool]:
    """``[(image file, label text)]`` of an ImageFolder layout (class subfolders, sorted) or of a flat folder with
    ``labels.csv`` (``file,label`` rows, an optional ``file,label`` header); and whether labels are class ids."""
    csv_path = root / LABELS_CSV
    if csv_path.is_file():
        import csv

        with open(csv_path, newline="", encoding="utf-8-sig") as f:  # a UTF-8 byte-order mark is not a file name
            reader = csv.reader(f)
            numbered = [(reader.line_num, r) for r in reader if r and any(c.strip() for c in r)]
        if numbered and [c.strip().lower() for c in numbered[0][1][:2]] == ["file", "label"]:
            numbered = numbered[1:]
        rows = [r for _, r in numbered]
        bad = [r for r in rows if len(r) != 2]
        if not rows or bad:
            raise ConfigError(f"{csv_path}: needs rows 'file,label' (two columns); got {bad[:1] or 'no rows'}")
        files = [(root / r[0].strip(), r[1].strip()) for r in rows]
        outside = [r[0] for r, (p, _) in zip(rows, files) if not p.resolve().is_relative_to(root.resolve())]
        if outside:
            raise ConfigError(f"{csv_path} names file(s) outside {root}: {outside[:3]}; every file lies under "
                              "data.root")
        missing = [str(p.name) for p, _ in files if not p.is_file()]
        if missing:
            raise ConfigError(f"{csv_path} names file(s) that are not in {root}: {missing[:3]}")
        seen: dict[Path, int] = {}
        for (line, _), (p, _) in zip(numbered, files):
            if p.resolve() in seen:
                raise ConfigError(f"{csv_path} line {line} names {p.name} again (first on line {seen[p.resolve()]}); "
                                  "each image once")
            seen[p.resolve()] = line
        numeric = [_NUMBER.fullmatch(label) is not None for _, label in files]
        if any(numeric):  # class ids: every label a non-negative integer
            for (line, row), (_, label) in zip(numbered, files):
                if not re.fullmatch(r"[0-9]+", label):
                    raise ConfigError(f"{csv_path} line {line} ({','.join(row)!r}): label {label!r} is not a class "
                                      "id; labels.csv holds class ids (integers >= 0) or class names, not both")
                if len(label.lstrip("0")) > 6 or int(label) >= MAX_CLASSES:  # no 100 000-digit int() either
                    raise ConfigError(f"{csv_path} line {line}: class id {label} is beyond the {MAX_CLASSES} classes "
                                      "a model may have")
        return files, any(numeric)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = [(p, c) for c in classes for p in sorted((root / c).iterdir())
             if p.suffix.lower() in IMAGE_SUFFIXES]
    present = {label for _, label in files}
    empty = [c for c in classes if c not in present]
    if files and empty:  # torchvision's ImageFolder refuses it too: the classes after it would change their ids
        raise ConfigError(f"data.root={str(root)!r}: class folder(s) {empty[:3]} hold no image "
                          f"({', '.join(IMAGE_SUFFIXES)}); remove them or add their images")
    if not files:
        raise ConfigError(f"data.root={str(root)!r} has neither class subfolders of images (torchvision ImageFolder "
                          f"layout: root/<class>/<image>.png) nor a flat folder with {LABELS_CSV} (file,label rows)")
    return files, False


@cache
def _read_folder_cached(root: Path, size: tuple[int, int] | None) -> tuple[Tensor, Tensor, tuple[str, ...]]:
    from PIL import Image

    files, numeric = _folder_files(root)
    pictures = []
    for path, _ in files:
        try:
            with Image.open(path) as img:  # reads the header only: the size is checked before any pixel
                if img.width * img.height > MAX_PIXELS:
                    raise ConfigError(f"image {path} claims {img.width}×{img.height} pixels, more than "
                                      f"{MAX_PIXELS} (a decompression bomb, or not a training image)")
                img.load()
                pictures.append(_eight_bit(img))
        except (OSError, Image.DecompressionBombError) as exc:
            raise ConfigError(f"cannot read image {path}: {exc}") from None
    grey = all(p.mode in _GREY_MODES for p in pictures)
    arrays = []
    for img in pictures:
        img = img.convert("L" if grey else "RGB")
        if size is not None and img.size != (size[1], size[0]):
            img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
        arrays.append(np.asarray(img, dtype=np.uint8).reshape(img.size[1], img.size[0], -1))
    shapes = sorted({a.shape[:2] for a in arrays})
    if len(shapes) > 1:
        raise ConfigError(f"the images under {root} have different sizes (H, W) {shapes[:3]}; set data.size (size=) "
                          "to resize them all, e.g. data.size=32")
    if numeric:
        ids = [int(label) for _, label in files]
        names = tuple(str(c) for c in range(max(ids) + 1))
    else:
        names = tuple(sorted({label for _, label in files}))
        ids = [names.index(label) for _, label in files]
    if len(names) < 2:
        raise ConfigError(f"the images under {root} have only the class(es) {list(names)}; a classifier needs >= 2")
    images = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor(ids, dtype=torch.long), names


def read_folder(split: str, root: Any, size: Size = None) -> tuple[Tensor, Tensor, list[str]]:
    """A user's folder of images (PNG, JPEG, …) as uint8 ``(N, C, H, W)``, labels and class names.

    ``root`` holds the torchvision ``ImageFolder`` layout (``root/<class>/<image>``, classes sorted by name) or a
    flat folder with ``labels.csv`` (``file,label``; integer labels are class ids, other labels class names,
    sorted; a label that reads as a number but is not an integer >= 0 is a ConfigError naming its line). A
    ``root/<split>`` subfolder is used when present. Grey files stay grey (1 channel) unless some are colour (then
    all are RGB); 16-bit grey files are scaled to 8 bits by 255/65535. Images of different sizes need ``size``
    (int or (H, W)), which resizes each.
    """
    if root is None:
        raise ConfigError("data.name=folder needs data.root=<folder of images> (class subfolders, or a flat folder "
                          f"with {LABELS_CSV})")
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ConfigError(f"data.root={str(base)!r} is not a folder")
    if (base / split).is_dir():
        base = base / split
    hw = None if size is None else ((size, size) if isinstance(size, int) else tuple(int(s) for s in size))
    images, labels, names = _read_folder_cached(base.resolve(), hw)
    return images, labels, list(names)


DATASETS: dict[str, _Source] = {
    "cifar10-samples": _Source(_samples_source("cifar10", False), ("test",), 10, lambda: CIFAR10_CLASSES,
                               summary="foolbox: 20 CIFAR-10 test images, 3×32×32"),
    "cifar100-samples": _Source(_samples_source("cifar100", False), ("test",), 100, lambda: CIFAR100_CLASSES,
                                summary="foolbox: 20 CIFAR-100 test images, 3×32×32"),
    "mnist-samples": _Source(_samples_source("mnist", True), ("test",), 10, lambda: DIGITS,
                             summary="foolbox: 20 MNIST test images, 1×28×28"),
    "fashion-mnist-samples": _Source(_samples_source("fashionMNIST", True), ("test",), 10,
                                     lambda: FASHION_CLASSES, summary="foolbox: 20 Fashion-MNIST images, 1×28×28"),
    "imagenet-samples": _Source(_samples_source("imagenet", False), ("test",), 1000, imagenet_classes,
                                default_size=224, summary="foolbox: 20 ImageNet images, 3×224×224 (size=)"),
    "fashion-mnist": _Source(_read_fashion_mnist, ("train", "test"), 10, lambda: FASHION_CLASSES,
                             summary="Debian dataset-fashion-mnist: 60k train / 10k test, 1×28×28", takes_root=True),
    "cifar10": _Source(_torchvision_source("CIFAR10", "cifar10"), ("train", "test"), 10,
                       lambda: CIFAR10_CLASSES, summary="torchvision CIFAR10 under root=", takes_root=True),
    "cifar100": _Source(_torchvision_source("CIFAR100", "cifar100"), ("train", "test"), 100,
                        lambda: CIFAR100_CLASSES, summary="torchvision CIFAR100 under root=", takes_root=True),
    "mnist": _Source(_torchvision_source("MNIST", "mnist"), ("train", "test"), 10, lambda: DIGITS,
                     summary="torchvision MNIST under root=", takes_root=True),
    "svhn": _Source(_torchvision_source("SVHN", "svhn"), ("train", "test", "extra"), 10, lambda: DIGITS,
                    summary="torchvision SVHN under root=", takes_root=True),
    "folder": _Source(lambda split, root: read_folder(split, root)[:2], ("train", "test"), 0, list,
                      summary="your images under root=: class subfolders (ImageFolder) or labels.csv; any size "
                              "(size= resizes), grey or RGB; root/<split> when present",
                      takes_root=True, read_folder=read_folder),
}


def class_names(name: str) -> list[str]:
    """The class names of the dataset ``name`` of :data:`DATASETS`, index = label (e.g. ``cifar10-samples``:
    airplane … truck; ``fashion-mnist``: T-shirt/top … Ankle boot); empty for ``folder`` (a user's classes are its
    subfolders, named when the data is read: :attr:`ImageDataset.classes`) and for a name that is no dataset."""
    source = DATASETS.get(name)
    return list(source.classes()) if source is not None else []


def _resize(images: Tensor, size: Size) -> Tensor:
    """Antialiased bilinear resize of float images in [0, 1] to ``size`` (int → square)."""
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if len(hw) != 2 or min(hw) < 1:
        raise ConfigError(f"size must be a positive int or (H, W), got {size!r}")
    if tuple(images.shape[-2:]) == hw:
        return images
    out = torch.empty(images.shape[0], images.shape[1], *hw, dtype=images.dtype)
    for start in range(0, images.shape[0], 4096):  # chunks bound the peak memory on 70k-image sets
        chunk = F.interpolate(images[start:start + 4096], size=hw, mode="bilinear", align_corners=False,
                              antialias=True)
        out[start:start + 4096] = chunk.clamp_(0.0, 1.0)
    return out


def load(name: str, split: str = "test", root: str | Path | None = None, size: Size = None) -> ImageDataset:
    """Load a dataset of real images in [0, 1] without touching the network.

    ``name``: one of :data:`DATASETS`. ``split``: ``"train"`` or ``"test"`` (samples sets have only
    ``"test"``; SVHN also ``"extra"``). ``root``: a torchvision dataset folder (``cifar10``, ``cifar100``,
    ``mnist``, ``svhn``; optional for ``fashion-mnist``). ``size``: resize (antialiased bilinear) to
    ``size × size`` or ``(H, W)``; ``imagenet-samples`` defaults to 224 (non-square originals are
    centre-cropped first). Decoded files are cached in-process, so a second load costs only the uint8→float copy.
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid: {sorted(DATASETS)}")
    source = DATASETS[name]
    if split not in source.splits:
        raise ConfigError(f"dataset {name!r} has no split {split!r}; valid: {list(source.splits)}")
    if root is not None and not source.takes_root:
        raise ConfigError(f"dataset {name!r} is bundled and takes no root=; datasets read from a root: "
                          f"{sorted(k for k, v in DATASETS.items() if v.takes_root)}")
    if source.read_folder is not None:
        raw, labels, classes = source.read_folder(split, root, size)
        return ImageDataset(raw.float().div_(255.0), labels.clone(), len(classes), name, classes, split)
    raw, labels = source.read(split, root)
    images = raw.float().div_(255.0)
    size = size if size is not None else source.default_size
    if size is not None:
        images = _resize(images, size)
    return ImageDataset(images, labels.clone(), source.num_classes, name, source.classes(), split)


def to_batch(dataset: Any, indices: Tensor | Sequence[int]) -> tuple[Tensor, Tensor]:
    """``(images[indices], labels[indices])`` of any object with ``.images`` and ``.labels``."""
    idx = torch.as_tensor(indices, dtype=torch.long)
    n = dataset.labels.shape[0]
    if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
        raise ConfigError(f"indices out of range for a dataset of {n} samples")
    return dataset.images[idx], dataset.labels[idx]


# ---------------------------------------------------------------------------------- label augmentation


def _check_labels(labels: Tensor, num_classes: int) -> Tensor:
    labels = torch.as_tensor(labels)
    if labels.ndim != 1 or labels.dtype.is_floating_point:
        raise ConfigError(f"labels must be class ids of shape (B,), got {labels.dtype} {tuple(labels.shape)}")
    if num_classes < 1:
        raise ConfigError(f"num_classes must be >= 1, got {num_classes}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ConfigError(f"labels must lie in [0, {num_classes}), got [{int(labels.min())}, {int(labels.max())}]")
    return labels.long()


def _as_coefficient(value: Any, n: int, what: str, dtype: torch.dtype) -> Tensor:
    """A scalar or ``(n,)`` coefficient in [0, 1] as a ``(n, 1)`` column; bad values raise ConfigError."""
    t = torch.as_tensor(value, dtype=dtype)
    if t.ndim == 0:
        t = t.expand(n)
    if t.shape != (n,):
        raise ConfigError(f"{what} must be a scalar or a ({n},) tensor, got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()) or bool((t < 0).any()) or bool((t > 1).any()):
        raise ConfigError(f"{what} must lie in [0, 1], got values in [{float(t.min())}, {float(t.max())}]")
    return t.unsqueeze(1)


def onehot(labels: Tensor, num_classes: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """One-hot targets ``(B, C)``."""
    labels = _check_labels(labels, num_classes)
    return F.one_hot(labels, num_classes).to(dtype)


def _smoothing(hot: Tensor, eps: Tensor, num_classes: int) -> Tensor:
    # soft-label paper §4.1: y = (1 − ε)·onehot + ε/C  (true class 1 − ε + ε/C, others ε/C)
    return (1.0 - eps) * hot + eps / num_classes


def _smoothing_alt(hot: Tensor, eps: Tensor, num_classes: int) -> Tensor:
    # posterior paper §3.2: y⁺ = 1 − ε, y⁻ = ε/(K − 1)
    if num_classes < 2:
        raise ConfigError("smoothing-alt needs num_classes >= 2 (y⁻ = ε/(C−1))")
    return hot * (1.0 - eps) + (1.0 - hot) * (eps / (num_classes - 1))


SMOOTHING_CONVENTIONS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "smoothing": _smoothing,
    "smoothing-alt": _smoothing_alt,
}


def smooth_labels(labels: Tensor, num_classes: int, eps: float | Tensor, convention: str = "smoothing",
                  dtype: torch.dtype = torch.float32) -> Tensor:
    """Smoothed soft labels ``(B, C)``; every row sums to 1.

    ``convention="smoothing"``: ``(1−ε)·onehot + ε/C`` (Wang, Liang & He 2024, §4.1; ε ~ U(0, 0.5) per
    sample there). ``convention="smoothing-alt"``: ``y⁺ = 1−ε``, ``y⁻ = ε/(C−1)`` (posterior paper §3.2,
    the label embedding of its eq. for λ_j). ``eps``: a scalar or a per-sample ``(B,)`` tensor in [0, 1].
    """
    if convention not in SMOOTHING_CONVENTIONS:
        raise ConfigError(f"unknown smoothing convention {convention!r}; valid: {sorted(SMOOTHING_CONVENTIONS)}")
    labels = _check_labels(labels, num_classes)
    e = _as_coefficient(eps, labels.shape[0], "label smoothing eps", dtype)
    hot = F.one_hot(labels, num_classes).to(dtype)
    return SMOOTHING_CONVENTIONS[convention](hot, e, num_classes)


def _as_soft(y: Tensor, num_classes: int, batch: int, dtype: torch.dtype, what: str) -> Tensor:
    y = torch.as_tensor(y)
    if y.ndim == 2:
        if y.shape != (batch, num_classes):
            raise ConfigError(f"{what} soft labels must be ({batch}, {num_classes}), got {tuple(y.shape)}")
        return y.to(dtype)
    if y.shape != (batch,):
        raise ConfigError(f"{what} must be ({batch},) class ids or ({batch}, {num_classes}) soft labels, "
                          f"got {tuple(y.shape)}")
    return F.one_hot(_check_labels(y, num_classes), num_classes).to(dtype)


def mixup(x1: Tensor, y1: Tensor, x2: Tensor, y2: Tensor, lam: float | Tensor,
          num_classes: int) -> tuple[Tensor, Tensor]:
    """Mixup (Zhang et al. 2018) in the soft-label paper's form (Wang, Liang & He 2024, §4.1).

    ``x = (1−λ)·x₁ + λ·x₂`` and ``soft = (1−λ)·onehot(y₁) + λ·onehot(y₂)``; ``lam`` is a scalar or a
    per-pair ``(B,)`` tensor in [0, 1]; ``y₁``/``y₂`` are class ids ``(B,)`` (or already soft ``(B, C)``).
    """
    if x1.shape != x2.shape or x1.ndim < 2:
        raise ConfigError(f"mixup needs two image batches of the same shape (B, ...), got {tuple(x1.shape)} "
                          f"and {tuple(x2.shape)}")
    b = x1.shape[0]
    dtype = x1.dtype if x1.dtype.is_floating_point else torch.float32
    lam_col = _as_coefficient(lam, b, "mixup lam", dtype)
    soft = (1.0 - lam_col) * _as_soft(y1, num_classes, b, dtype, "y1") + lam_col * _as_soft(y2, num_classes, b,
                                                                                             dtype, "y2")
    lam_img = lam_col.view(b, *([1] * (x1.ndim - 1)))
    x = (1.0 - lam_img) * x1.to(dtype) + lam_img * x2.to(dtype)
    return x, soft


def _onehot_kind(labels: Tensor, num_classes: int, eps: Any, dtype: torch.dtype) -> Tensor:
    if eps is not None and not bool((torch.as_tensor(eps) == 0).all()):
        raise ConfigError(f"onehot targets take no eps (got {eps!r}); use kind='smoothing' or 'smoothing-alt'")
    return onehot(labels, num_classes, dtype)


def _smoothing_kind(convention: str) -> Callable[[Tensor, int, Any, torch.dtype], Tensor]:
    def make(labels: Tensor, num_classes: int, eps: Any, dtype: torch.dtype) -> Tensor:
        if eps is None:
            raise ConfigError(f"{convention} targets need eps (a float or a (B,) tensor in [0, 1])")
        return smooth_labels(labels, num_classes, eps, convention, dtype)

    return make


TARGET_KINDS: dict[str, Callable[[Tensor, int, Any, torch.dtype], Tensor]] = {
    "onehot": _onehot_kind,
    "smoothing": _smoothing_kind("smoothing"),
    "smoothing-alt": _smoothing_kind("smoothing-alt"),
}


def make_targets(labels: Tensor, num_classes: int, kind: str, eps: float | Tensor | None = None,
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """Soft targets ``(B, C)`` of a label-augmentation ``kind`` (``onehot | smoothing | smoothing-alt``).

    Mixup needs pairs of images, so it is :func:`mixup`, not a kind here.
    """
    if kind not in TARGET_KINDS:
        hint = "; mixup needs image pairs: use gi.world.data.mixup" if kind == "mixup" else ""
        raise ConfigError(f"unknown target kind {kind!r}; valid: {sorted(TARGET_KINDS)}{hint}")
    return TARGET_KINDS[kind](labels, num_classes, eps, dtype)


# ------------------------------------------------------------------------------------------- sampling


def _labels_of(dataset: Any) -> Tensor:
    labels = getattr(dataset, "labels", None)
    if labels is None or getattr(dataset, "images", None) is None:
        raise ConfigError("dataset must have .images and .labels (e.g. gi.world.data.load(...))")
    return labels


def _num_classes(dataset: Any) -> int:
    labels = _labels_of(dataset)
    return int(getattr(dataset, "num_classes", int(labels.max()) + 1 if labels.numel() else 0))


def _choose(pool: Tensor, k: int, generator: torch.Generator, replace: bool, what: str) -> Tensor:
    if k < 0:
        raise ConfigError(f"{what}: size must be >= 0, got {k}")
    if replace:
        if pool.numel() == 0 and k > 0:
            raise ConfigError(f"{what}: no samples to draw from")
        return pool[torch.randint(pool.numel(), (k,), generator=generator)]
    if k > pool.numel():
        raise ConfigError(f"{what}: asked for {k} samples without replacement but only {pool.numel()} are "
                          "available; pass replace=True or a smaller size")
    return pool[torch.randperm(pool.numel(), generator=generator)[:k]]


def sample_batch(dataset: Any, batch_size: int, generator: torch.Generator, classes: Sequence[int] | None = None,
                 replace: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """A uniformly random batch ``(images, labels, indices)``.

    ``classes`` restricts the pool to those class ids; ``replace=True`` draws with replacement (allows
    batches larger than the pool, e.g. 64 images out of the 20 foolbox samples).
    """
    labels = _labels_of(dataset)
    pool = torch.arange(labels.shape[0])
    if classes is not None:
        wanted = torch.as_tensor(list(classes), dtype=torch.long)
        pool = pool[torch.isin(labels, wanted)]
    idx = _choose(pool, int(batch_size), generator, replace, "sample_batch")
    images, lab = to_batch(dataset, idx)
    return images, lab, idx


def class_order(labels: Tensor, generator: torch.Generator) -> Tensor:
    """Indices sorted by class, uniformly shuffled within each class (one sort, no per-sample loop)."""
    keys = torch.randperm(labels.shape[0], generator=generator)
    order = torch.argsort(labels[keys], stable=True)
    return keys[order]


def sample_aux(dataset: Any, per_class: int, generator: torch.Generator, exclude: Tensor | Sequence[int] | None = None,
               info: dict | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The attacker's auxiliary set: ``per_class`` samples of every class, disjoint from ``exclude``.

    ``exclude`` are the victim's indices (never drawn). Each class takes ``per_class`` distinct samples;
    a class with fewer (but some) left takes all of them once and fills the shortfall by drawing with
    replacement from them (Ramakrishna & Dán draw aux data with replacement); a class with none left is
    skipped. Both cases warn and are recorded in ``info`` (if given) under ``"replaced"`` and
    ``"missing"`` (class id → available count). Output is ordered by class.
    """
    labels = _labels_of(dataset)
    num_classes = _num_classes(dataset)
    if per_class < 1:
        raise ConfigError(f"sample_aux: per_class must be >= 1, got {per_class}")
    n = labels.shape[0]
    allowed = torch.ones(n, dtype=torch.bool)
    if exclude is not None:
        ex = torch.as_tensor(exclude, dtype=torch.long).reshape(-1)
        if ex.numel() and (int(ex.min()) < 0 or int(ex.max()) >= n):
            raise ConfigError(f"sample_aux: exclude indices must lie in [0, {n})")
        allowed[ex] = False
    pool = torch.arange(n)[allowed]
    ordered = pool[class_order(labels[pool], generator)]
    ordered_labels = labels[ordered]
    available = torch.bincount(ordered_labels, minlength=num_classes)
    starts = torch.cumsum(available, 0) - available
    rank = torch.arange(ordered.numel()) - starts[ordered_labels]
    chosen = [ordered[rank < per_class]]
    short = torch.nonzero((available > 0) & (available < per_class)).flatten().tolist()
    replaced = {c: int(available[c]) for c in short}
    missing = {c: 0 for c in torch.nonzero(available == 0).flatten().tolist()}
    for c, have in replaced.items():  # only the (rare) short classes loop
        block = ordered[int(starts[c]):int(starts[c]) + have]
        chosen.append(block[torch.randint(have, (per_class - have,), generator=generator)])
    idx = torch.cat(chosen)
    idx = idx[torch.argsort(labels[idx], stable=True)]
    if replaced or missing:
        warnings.warn(f"sample_aux: classes with fewer than {per_class} samples outside exclude were filled with "
                      f"replacement {replaced} or skipped {sorted(missing)}", stacklevel=2)
    if info is not None:
        info.update(replaced=replaced, missing=missing)
    images, lab = to_batch(dataset, idx)
    return images, lab, idx


def sample_mixup_pairs(dataset: Any, n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``n`` index pairs ``(idx1, idx2)`` with ``labels[idx1] != labels[idx2]`` for mixup.

    ``idx1`` is uniform over the dataset; ``idx2`` is uniform over the samples of the *other* classes
    (exact, no rejection: a draw in ``[0, N − n_c)`` skips class c's block of the class-sorted order).
    The soft-label paper picks 1000 such couples from CIFAR-10 test (§4.1).
    """
    labels = _labels_of(dataset)
    num_classes = _num_classes(dataset)
    counts = torch.bincount(labels, minlength=num_classes)
    if int((counts > 0).sum()) < 2:
        raise ConfigError("sample_mixup_pairs needs samples of at least two classes")
    if n < 0:
        raise ConfigError(f"sample_mixup_pairs: n must be >= 0, got {n}")
    sorted_idx = torch.argsort(labels, stable=True)
    starts = torch.cumsum(counts, 0) - counts
    idx1 = torch.randint(labels.shape[0], (n,), generator=generator)
    c = labels[idx1]
    others = labels.shape[0] - counts[c]
    r = (torch.rand(n, generator=generator, dtype=torch.float64) * others).long().clamp_max_(others - 1)
    r = torch.where(r < starts[c], r, r + counts[c])
    return idx1, sorted_idx[r]


def sample_mixup_class_pairs(dataset: Any, per_pair: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Every unordered class pair ``(i < j)`` ``per_pair`` times, one random image of each class.

    The soft-label paper's image-reconstruction setting: 45 CIFAR-10 class tuples, one image each (§4.3).
    Classes without samples are left out.
    """
    labels = _labels_of(dataset)
    counts = torch.bincount(labels, minlength=_num_classes(dataset))
    present = torch.nonzero(counts).flatten()
    pairs = torch.combinations(present, 2).repeat_interleave(per_pair, dim=0)
    sorted_idx = torch.argsort(labels, stable=True)
    starts = torch.cumsum(counts, 0) - counts

    def pick(cls: Tensor) -> Tensor:
        off = (torch.rand(cls.numel(), generator=generator, dtype=torch.float64) * counts[cls]).long()
        return sorted_idx[starts[cls] + off.minimum(counts[cls] - 1)]

    return pick(pairs[:, 0]), pick(pairs[:, 1])


def class_imbalanced_batch(dataset: Any, batch_size: int, major_class: int, fraction: float,
                           generator: torch.Generator, replace: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """A batch where ``round(fraction·B)`` samples are of ``major_class`` and the rest uniform over the
    samples of the other classes (posterior paper §4.3, Fig. 3: class proportions 10%–90%).

    Returns ``(images, labels, indices)`` in random order.
    """
    labels = _labels_of(dataset)
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"class_imbalanced_batch: fraction must lie in [0, 1], got {fraction}")
    if not 0 <= major_class < _num_classes(dataset):
        raise ConfigError(f"class_imbalanced_batch: major_class {major_class} is not a class id")
    n_major = int(round(fraction * batch_size))
    is_major = labels == major_class
    all_idx = torch.arange(labels.shape[0])
    major = _choose(all_idx[is_major], n_major, generator, replace, f"class_imbalanced_batch (class {major_class})")
    minor = _choose(all_idx[~is_major], batch_size - n_major, generator, replace,
                    "class_imbalanced_batch (other classes)")
    idx = torch.cat([major, minor])
    idx = idx[torch.randperm(idx.numel(), generator=generator)]
    images, lab = to_batch(dataset, idx)
    return images, lab, idx



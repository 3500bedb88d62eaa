"""gi.world.data: offline real images, label augmentation conventions, seeded sampling and partitions."""

from __future__ import annotations

import gzip
import re
import struct
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from gi.core.errors import AssetError, ConfigError
from gi.world import assets
from gi.world import data as gd
from gi.world.fl.partition import dirichlet_partition

SAMPLE_SETS = {
    # name: (file prefix, image shape, num_classes)
    "cifar10-samples": ("cifar10", (3, 32, 32), 10),
    "cifar100-samples": ("cifar100", (3, 32, 32), 100),
    "mnist-samples": ("mnist", (1, 28, 28), 10),
    "fashion-mnist-samples": ("fashionMNIST", (1, 28, 28), 10),
    "imagenet-samples": ("imagenet", (3, 224, 224), 1000),
}


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def synthetic(labels: list[int] | torch.Tensor, num_classes: int | None = None) -> gd.ImageDataset:
    labels = torch.as_tensor(labels, dtype=torch.long)
    n = labels.numel()
    # image i is constant i/n, so a drawn image identifies its index
    images = (torch.arange(n, dtype=torch.float32) / max(n, 1)).view(n, 1, 1, 1).expand(n, 1, 2, 2).clone()
    return gd.ImageDataset(images, labels, num_classes or int(labels.max()) + 1, "synthetic")


def file_labels(prefix: str) -> list[int]:
    pattern = re.compile(rf"^{prefix}_(\d+)_(\d+)\.(png|jpg)$")
    hits = sorted((int(m[1]), int(m[2])) for f in assets.foolbox_samples_dir().iterdir()
                  if (m := pattern.match(f.name)))
    return [label for _, label in hits]


# ------------------------------------------------------------------------------------------- loading


@pytest.mark.parametrize("name", sorted(SAMPLE_SETS))
def test_sample_sets_load_real_images_with_file_name_labels(name):
    prefix, shape, num_classes = SAMPLE_SETS[name]
    ds = gd.load(name)
    assert len(ds) == 20 and ds.images.shape == (20, *shape)
    assert ds.images.dtype == torch.float32 and ds.labels.dtype == torch.long
    assert 0.0 <= float(ds.images.min()) and float(ds.images.max()) <= 1.0
    assert float(ds.images.std()) > 0.1  # real pictures, not blanks
    assert ds.labels.tolist() == file_labels(prefix)
    assert ds.num_classes == num_classes and len(ds.classes) == num_classes and ds.name == name
    image, label = ds[0]
    assert image.shape == shape and int(label) == ds.labels[0]


def test_sample_pixels_and_known_labels():
    ds = gd.load("cifar10-samples")
    assert int(ds.labels[0]) == 3 and ds.classes[3] == "cat"  # cifar10_00_3.png
    png = np.asarray(Image.open(assets.foolbox_samples_dir() / "cifar10_00_3.png").convert("RGB"))
    assert torch.equal(ds.images[0], torch.from_numpy(png).permute(2, 0, 1).float() / 255)
    assert gd.load("mnist-samples").labels[:5].tolist() == [7, 2, 1, 0, 4]
    assert gd.load("cifar100-samples").classes[49] == "mountain"
    assert gd.load("imagenet-samples", size=8).classes[243] == "bull mastiff"


def test_resize_is_antialiased_and_applies_to_every_set():
    full = gd.load("imagenet-samples")  # 224 by default
    small = gd.load("imagenet-samples", size=64)
    assert small.images.shape == (20, 3, 64, 64)
    # an antialiased downscale keeps each image's mean intensity; plain bilinear at 224→32 would alias
    tiny = gd.load("imagenet-samples", size=32)
    assert torch.allclose(tiny.images.mean((1, 2, 3)), full.images.mean((1, 2, 3)), atol=0.002)  # no AA: 0.008
    assert float((tiny.images[..., 1:] - tiny.images[..., :-1]).abs().mean()) < 0.07  # no AA: 0.10
    assert gd.load("imagenet-samples", size=(24, 40)).images.shape == (20, 3, 24, 40)
    assert gd.load("cifar10-samples", size=16).images.shape == (20, 3, 16, 16)
    assert gd.load("mnist-samples", size=32).images.shape == (20, 1, 32, 32)
    with pytest.raises(ConfigError, match="size"):
        gd.load("cifar10-samples", size=0)


def test_fashion_mnist_full_train_and_test():
    train = gd.load("fashion-mnist", "train")
    test = gd.load("fashion-mnist", "test")
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    assert train.num_classes == 10 and train.counts.tolist() == [6000] * 10 and test.counts.tolist() == [1000] * 10
    assert train.images.dtype == torch.float32
    assert float(train.images.min()) == 0.0 and float(train.images.max()) == 1.0
    assert int(train.labels[0]) == 9 and int(test.labels[0]) == 9  # both start with an ankle boot
    # foolbox's fashion samples are the first 20 test images: the two decoders agree pixel for pixel
    samples = gd.load("fashion-mnist-samples")
    assert torch.equal(test.labels[:20], samples.labels) and torch.equal(test.images[:20], samples.images)


def test_fashion_mnist_decoding_is_cached():
    gd.load("fashion-mnist", "test")
    hits = gd._read_idx.cache_info().hits
    again = gd.load("fashion-mnist", "test")
    assert gd._read_idx.cache_info().hits == hits + 2  # images + labels, no second decode
    again.images[0].fill_(0.5)  # a load returns its own copy: mutating it leaves the cache intact
    assert float(gd.load("fashion-mnist", "test").images[0].max()) == 1.0


def _write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("name, folder", [("mnist", "MNIST"), ("fashion-mnist", "FashionMNIST")])
def test_torchvision_root(tmp_path, name, folder):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for stem, n in (("train", 6), ("t10k", 4)):
        _write_idx(raw / f"{stem}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(raw / f"{stem}-labels-idx1-ubyte", np.arange(n) % 10)
    ds = gd.load(name, "train", root=tmp_path)
    assert ds.images.shape == (6, 1, 28, 28) and ds.labels.tolist() == list(range(6))
    assert 0.0 <= float(ds.images.min()) and float(ds.images.max()) <= 1.0
    assert gd.load(name, "test", root=tmp_path, size=14).images.shape == (4, 1, 14, 14)


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown dataset 'cifar11'.*cifar10-samples.*fashion-mnist"):
        gd.load("cifar11")
    with pytest.raises(ConfigError, match=r"no split 'train'.*\['test'\]"):
        gd.load("cifar10-samples", "train")
    with pytest.raises(ConfigError, match="split"):
        gd.load("fashion-mnist", "valid")
    with pytest.raises(AssetError, match="root="):
        gd.load("cifar10", "train")
    with pytest.raises(AssetError, match="root="):
        gd.load("svhn", "test", root=tmp_path / "nowhere")
    with pytest.raises(AssetError, match="not found under root"):
        gd.load("cifar100", "test", root=tmp_path)
    with pytest.raises(ConfigError, match="takes no root"):
        gd.load("mnist-samples", root=tmp_path)


def test_missing_or_broken_assets_are_asset_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(gd.assets, "foolbox_samples_dir", lambda: tmp_path)
    gd._read_samples.cache_clear()
    try:
        with pytest.raises(AssetError, match="foolbox"):
            gd.load("cifar10-samples")
    finally:
        gd._read_samples.cache_clear()
    bad = tmp_path / "bad-idx3-ubyte.gz"
    bad.write_bytes(gzip.compress(b"\x00\x00\x0d\x01" + b"\x00" * 8))
    with pytest.raises(AssetError, match="not an unsigned-byte IDX"):
        gd._read_idx(bad)
    short = tmp_path / "short-idx1-ubyte"
    short.write_bytes(struct.pack(">BBBBI", 0, 0, 8, 1, 10) + b"\x01\x02")
    with pytest.raises(AssetError, match="truncated"):
        gd._read_idx(short)
    with pytest.raises(AssetError, match="missing"):
        gd._read_idx(tmp_path / "absent-idx1-ubyte.gz")


def test_to_batch_and_subset():
    ds = synthetic([0, 1, 2, 0, 1])
    images, labels = gd.to_batch(ds, [4, 0])
    assert labels.tolist() == [1, 0] and torch.equal(images, ds.images[[4, 0]])
    assert ds.subset([1, 3]).labels.tolist() == [1, 0]
    with pytest.raises(ConfigError, match="out of range"):
        gd.to_batch(ds, [5])


# ---------------------------------------------------------------------------------- label augmentation


def test_smoothing_conventions_exact_values():
    labels = torch.tensor([2, 0])
    soft = gd.smooth_labels(labels, 10, 0.2)  # soft-label paper: (1−ε)·onehot + ε/C
    assert soft[0, 2].item() == pytest.approx(0.82) and soft[0, 0].item() == pytest.approx(0.02)
    assert soft[1, 0].item() == pytest.approx(0.82) and soft[1, 9].item() == pytest.approx(0.02)
    alt = gd.smooth_labels(labels, 10, 0.2, "smoothing-alt")  # posterior paper: y⁺ = 1−ε, y⁻ = ε/(C−1)
    assert alt[0, 2].item() == pytest.approx(0.8) and alt[0, 1].item() == pytest.approx(0.2 / 9)
    per_sample = gd.smooth_labels(labels, 4, torch.tensor([0.0, 0.4]), dtype=torch.float64)
    assert per_sample.dtype == torch.float64
    assert torch.allclose(per_sample, torch.tensor([[0, 0, 1, 0], [0.7, 0.1, 0.1, 0.1]], dtype=torch.float64))
    for s in (soft, alt, per_sample):
        assert torch.allclose(s.sum(1), torch.ones(2, dtype=s.dtype))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 50), st.integers(1, 16), st.sampled_from(["smoothing", "smoothing-alt"]), st.integers(0, 10**6))
def test_smoothing_rows_on_the_simplex(num_classes, batch, convention, seed):
    g = gen(seed)
    labels = torch.randint(num_classes, (batch,), generator=g)
    eps = torch.rand(batch, generator=g, dtype=torch.float64)
    soft = gd.smooth_labels(labels, num_classes, eps, convention, dtype=torch.float64)
    assert torch.allclose(soft.sum(1), torch.ones(batch, dtype=torch.float64))
    assert bool((soft >= 0).all())
    top = soft.gather(1, labels[:, None]).squeeze(1)
    expected = 1 - eps + (eps / num_classes if convention == "smoothing" else 0)
    assert torch.allclose(top, expected)


def test_make_targets_registry():
    labels = torch.tensor([1, 3, 0])
    assert torch.equal(gd.make_targets(labels, 4, "onehot"), torch.eye(4)[labels])
    assert torch.equal(gd.make_targets(labels, 4, "smoothing", 0.3), gd.smooth_labels(labels, 4, 0.3))
    assert torch.equal(gd.make_targets(labels, 4, "smoothing-alt", 0.3),
                       gd.smooth_labels(labels, 4, 0.3, "smoothing-alt"))
    assert set(gd.TARGET_KINDS) == {"onehot", "smoothing", "smoothing-alt"}
    with pytest.raises(ConfigError, match="mixup"):
        gd.make_targets(labels, 4, "mixup")
    with pytest.raises(ConfigError, match="need eps"):
        gd.make_targets(labels, 4, "smoothing")
    with pytest.raises(ConfigError, match="no eps"):
        gd.make_targets(labels, 4, "onehot", eps=0.1)


@pytest.mark.parametrize("eps", [-0.1, 1.5, float("nan"), torch.tensor([0.1, 0.2])])
def test_bad_eps_is_a_config_error(eps):
    with pytest.raises(ConfigError, match="eps"):
        gd.smooth_labels(torch.tensor([0, 1, 2]), 3, eps)


def test_bad_labels_and_convention():
    with pytest.raises(ConfigError, match="lie in"):
        gd.smooth_labels(torch.tensor([0, 3]), 3, 0.1)
    with pytest.raises(ConfigError, match="class ids"):
        gd.smooth_labels(torch.tensor([0.0, 1.0]), 3, 0.1)
    with pytest.raises(ConfigError, match="convention"):
        gd.smooth_labels(torch.tensor([0]), 3, 0.1, "szegedy")


def test_mixup_is_the_convex_combination():
    g = gen(1)
    x1, x2 = torch.rand(3, 3, 4, 4, generator=g), torch.rand(3, 3, 4, 4, generator=g)
    lam = torch.tensor([0.0, 0.25, 1.0])
    x, soft = gd.mixup(x1, torch.tensor([0, 1, 2]), x2, torch.tensor([3, 2, 0]), lam, 4)
    assert torch.allclose(x[1], 0.75 * x1[1] + 0.25 * x2[1])
    assert torch.equal(x[0], x1[0]) and torch.equal(x[2], x2[2])
    assert torch.allclose(soft, torch.tensor([[1.0, 0, 0, 0], [0, 0.75, 0.25, 0], [1.0, 0, 0, 0]]))
    # scalar λ, and already-soft labels (mixup of smoothed labels)
    y1 = gd.smooth_labels(torch.tensor([0, 1, 2]), 4, 0.2)
    x, soft = gd.mixup(x1, y1, x2, torch.tensor([3, 3, 3]), 0.5, 4)
    assert torch.allclose(x, 0.5 * (x1 + x2)) and torch.allclose(soft, 0.5 * y1 + 0.5 * torch.eye(4)[[3, 3, 3]])


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 20), st.integers(1, 8), st.integers(0, 10**6))
def test_mixup_targets_on_the_simplex(num_classes, batch, seed):
    g = gen(seed)
    y1, y2 = torch.randint(num_classes, (2, batch), generator=g)
    lam = torch.rand(batch, generator=g)
    x1, x2 = torch.rand(2, batch, 1, 2, 2, generator=g)
    x, soft = gd.mixup(x1, y1, x2, y2, lam, num_classes)
    assert torch.allclose(soft.sum(1), torch.ones(batch))
    assert torch.allclose(soft[torch.arange(batch), y2] - (y1 == y2) * (1 - lam), lam, atol=1e-6)
    assert torch.allclose(x, (1 - lam.view(-1, 1, 1, 1)) * x1 + lam.view(-1, 1, 1, 1) * x2)


def test_mixup_errors():
    x = torch.rand(2, 1, 2, 2)
    y = torch.tensor([0, 1])
    with pytest.raises(ConfigError, match="lam"):
        gd.mixup(x, y, x, y, 1.5, 2)
    with pytest.raises(ConfigError, match="same shape"):
        gd.mixup(x, y, torch.rand(3, 1, 2, 2), torch.tensor([0, 1, 0]), 0.5, 2)
    with pytest.raises(ConfigError, match="y2"):
        gd.mixup(x, y, x, torch.tensor([0]), 0.5, 2)


# ------------------------------------------------------------------------------------------- sampling


def test_sample_batch():
    ds = synthetic(torch.arange(30) % 3)
    images, labels, idx = gd.sample_batch(ds, 8, gen(0))
    assert idx.unique().numel() == 8 and torch.equal(labels, ds.labels[idx]) and torch.equal(images, ds.images[idx])
    assert torch.equal(idx, gd.sample_batch(ds, 8, gen(0))[2])
    assert not torch.equal(idx, gd.sample_batch(ds, 8, gen(1))[2])
    _, labels, _ = gd.sample_batch(ds, 10, gen(0), classes=[2])
    assert labels.tolist() == [2] * 10
    _, _, idx = gd.sample_batch(ds, 64, gen(0), replace=True)
    assert idx.numel() == 64 and idx.unique().numel() <= 30
    with pytest.raises(ConfigError, match="replace=True"):
        gd.sample_batch(ds, 31, gen(0))
    with pytest.raises(ConfigError, match="replace=True"):
        gd.sample_batch(ds, 11, gen(0), classes=[0])


def test_sample_batch_on_real_samples():
    ds = gd.load("cifar10-samples")
    images, labels, idx = gd.sample_batch(ds, 4, gen(3))
    assert images.shape == (4, 3, 32, 32) and torch.equal(labels, ds.labels[idx])


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.integers(0, 10**6))
def test_sample_aux_disjoint_and_per_class(num_classes, per_class, seed):
    g = gen(seed)
    labels = torch.arange(num_classes).repeat(per_class + 3)[torch.randperm(num_classes * (per_class + 3), generator=g)]
    ds = synthetic(labels, num_classes)
    exclude = torch.randperm(labels.numel(), generator=g)[:3]  # every class keeps >= per_class samples
    info: dict = {}
    images, aux_labels, idx = gd.sample_aux(ds, per_class, g, exclude=exclude, info=info)
    assert not bool(torch.isin(idx, exclude).any())
    assert torch.bincount(aux_labels, minlength=num_classes).tolist() == [per_class] * num_classes
    assert idx.unique().numel() == idx.numel()  # no replacement needed
    assert torch.equal(aux_labels, ds.labels[idx]) and torch.equal(images, ds.images[idx])
    assert aux_labels.tolist() == sorted(aux_labels.tolist())
    assert info == {"replaced": {}, "missing": {}}


def test_sample_aux_short_and_missing_classes_are_recorded():
    ds = synthetic([0, 0, 0, 0, 1, 1, 2], num_classes=4)
    info: dict = {}
    with pytest.warns(UserWarning, match="replacement"):
        _, labels, idx = gd.sample_aux(ds, 3, gen(0), exclude=[6, 5], info=info)
    assert info == {"replaced": {1: 1}, "missing": {2: 0, 3: 0}}
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert idx[:3].unique().numel() == 3 and idx[3:].tolist() == [4, 4, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(gd.sample_aux(synthetic([2, 0, 0, 1]), 1, gen(5))[1], torch.tensor([0, 1, 2]))
    with pytest.raises(ConfigError, match="per_class"):
        gd.sample_aux(ds, 0, gen(0))


def test_sample_aux_on_fashion_mnist_avoids_the_victim():
    ds = gd.load("fashion-mnist", "test")
    _, _, victim = gd.sample_batch(ds, 64, gen(0))
    _, labels, idx = gd.sample_aux(ds, 100, gen(1), exclude=victim)
    assert idx.numel() == 1000 and not bool(torch.isin(idx, victim).any()) and idx.unique().numel() == 1000
    assert ds.labels[idx].bincount().tolist() == [100] * 10


def test_mixup_pairs_are_from_different_classes_and_uniform():
    ds = synthetic([0, 0, 1, 2])
    idx1, idx2 = gd.sample_mixup_pairs(ds, 4000, gen(0))
    assert bool((ds.labels[idx1] != ds.labels[idx2]).all())
    partner = idx2[ds.labels[idx1] == 0]  # partners of class 0 are samples 2 and 3, each with probability 1/2
    assert abs(float((partner == 2).float().mean()) - 0.5) < 0.05
    partner = idx2[idx1 == 2]  # partners of sample 2 (class 1): 0, 1, 3 with probability 1/3 each
    assert set(partner.tolist()) == {0, 1, 3}
    assert torch.equal(gd.sample_mixup_pairs(ds, 50, gen(7))[1], gd.sample_mixup_pairs(ds, 50, gen(7))[1])
    with pytest.raises(ConfigError, match="two classes"):
        gd.sample_mixup_pairs(synthetic([1, 1]), 3, gen(0))


def test_mixup_class_pairs_cover_every_pair():
    ds = synthetic(torch.arange(40) % 10)
    idx1, idx2 = gd.sample_mixup_class_pairs(ds, 2, gen(0))
    pairs = set(zip(ds.labels[idx1].tolist(), ds.labels[idx2].tolist(), strict=True))
    assert idx1.numel() == 90 and len(pairs) == 45 and all(a < b for a, b in pairs)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_class_imbalanced_batch(fraction):
    ds = gd.load("fashion-mnist", "test")
    _, labels, idx = gd.class_imbalanced_batch(ds, 64, 3, fraction, gen(0))
    assert idx.numel() == 64 and idx.unique().numel() == 64
    assert int((labels == 3).sum()) == round(fraction * 64)
    assert len(set(labels[labels != 3].tolist())) >= 5  # the rest is spread over the other classes
    with pytest.raises(ConfigError, match="fraction"):
        gd.class_imbalanced_batch(ds, 64, 3, 1.5, gen(0))
    with pytest.raises(ConfigError, match="major_class"):
        gd.class_imbalanced_batch(ds, 64, 10, 0.5, gen(0))


# ----------------------------------------------------------------------------------------- partitions


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 200), st.integers(1, 6), st.floats(0.05, 100.0), st.booleans(), st.integers(0, 10**6))
def test_dirichlet_partition_is_a_partition(n, num_clients, alpha, balance, seed):
    labels = torch.randint(5, (n,), generator=gen(seed))
    parts = dirichlet_partition(labels, num_clients, alpha, gen(seed), min_size=0, balance=balance)
    assert len(parts) == num_clients
    assert torch.equal(torch.sort(torch.cat(parts)).values, torch.arange(n))


def test_dirichlet_partition_deterministic_and_heterogeneity():
    labels = gd.load("fashion-mnist", "train").labels
    a = dirichlet_partition(labels, 10, 0.5, gen(0))
    b = dirichlet_partition(labels, 10, 0.5, gen(0))
    c = dirichlet_partition(labels, 10, 0.5, gen(1))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))

    def mix(parts):  # (clients, classes) class proportions of each client
        counts = torch.stack([torch.bincount(labels[p], minlength=10) for p in parts]).double()
        return counts / counts.sum(1, keepdim=True)

    uniform = mix(dirichlet_partition(labels, 10, 1e4, gen(0)))
    assert float((uniform - 0.1).abs().max()) < 0.02  # α → ∞: every client holds the global mix
    skewed = mix(dirichlet_partition(labels, 10, 0.05, gen(0)))
    assert float(skewed.max(1).values.mean()) > 0.5  # α small: clients dominated by few classes


def test_dirichlet_rounding_is_unbiased():
    # one sample per class: the floor-of-cumsum split would give every sample to the last client
    labels = torch.arange(2000)
    sizes = torch.stack([torch.tensor([p.numel() for p in dirichlet_partition(labels, 4, 1.0, gen(s), min_size=0)])
                         for s in range(5)]).sum(0)
    assert int(sizes.min()) > 0.2 * 10000 / 4


def test_dirichlet_partition_min_size_and_errors():
    labels = torch.arange(100) % 10
    parts = dirichlet_partition(labels, 5, 0.1, gen(0), min_size=10)
    assert min(p.numel() for p in parts) >= 10
    with pytest.raises(ConfigError, match="exceeds"):
        dirichlet_partition(labels, 11, 1.0, gen(0), min_size=10)
    with pytest.raises(ConfigError, match="alpha"):
        dirichlet_partition(labels, 5, 0.0, gen(0))
    with pytest.raises(ConfigError, match="no draw"):
        dirichlet_partition(labels, 10, 0.01, gen(0), min_size=10, max_tries=3)

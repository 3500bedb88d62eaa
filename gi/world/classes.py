"""The class names of the bundled datasets, index = label (docs/usage.md, "Data"): read by
:func:`gi.world.data.class_names` for captions and reports; ImageNet's from torchvision's metadata."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from gi.core.errors import AssetError

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
DIGITS = [str(d) for d in range(10)]
FASHION_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot"]


@cache
def imagenet_classes() -> list[str]:
    """The 1000 ImageNet class names shipped in torchvision's ``models/_meta.py`` (read without importing
    ``torchvision.models``, which costs about a second)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    meta = Path(list(spec.submodule_search_locations)[0]) / "models" / "_meta.py"  # type: ignore[union-attr]
    for node in ast.parse(meta.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_IMAGENET_CATEGORIES":
            return list(ast.literal_eval(node.value))
    raise AssetError(f"no _IMAGENET_CATEGORIES in {meta}; reinstall torchvision")


__all__ = ["CIFAR100_CLASSES", "CIFAR10_CLASSES", "DIGITS", "FASHION_CLASSES", "imagenet_classes"]

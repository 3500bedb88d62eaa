"""The labels of a finished round's run read from its fitted images (a probe): each image's input of the hidden
layer in place of the true inputs of ``research/probe_round_e5_labels.py``, the errors ē = (−ΔW/η) X⁺ and the label
argmax(p − g/E) of each (``labels.fc_inputs.hidden_errors``), beside the true inputs'; per-image agreement after
matching the images to the truth one to one, split at 20 dB.

    python research/probe_round_relabel.py RUN     (RUN: an output directory of gi run on a FedAvg round)
"""
import sys

import torch
from safetensors.torch import load_file

from fcn_analytic.disaggregate import first_linear, summed_layer
from gi.analysis.metrics import match_images, psnr
from gi.capture import Capture, Truth
from labels.fc_inputs import hidden_errors

torch.set_num_threads(1)
run = sys.argv[1]
capture, truth = Capture.load(f"{run}/capture.safetensors"), Truth.load(f"{run}/truth.safetensors")
images = load_file(f"{run}/reconstructions.safetensors")["capture0"]
net = capture.model()
name = first_linear(net)
summed = summed_layer(capture, name)
epochs = capture.protocol.local_epochs
with torch.no_grad():
    fitted = net.body[0](net.normalize(images)).double()
    true = net.body[0](net.normalize(truth.images)).double()
match = match_images(images, truth.images)  # match[i]: the fitted image of true image i
score = psnr(images[match], truth.images)


def read(x: torch.Tensor) -> torch.Tensor:
    errors = torch.linalg.lstsq(x.T, summed.weight.T).solution * summed.per_mean
    logits, g, _ = hidden_errors(capture, name, x, errors)
    return (torch.softmax(logits, 1) - g / epochs).argmax(1)


print("true counts  ", truth.counts.tolist())
for tag, x, order in (("true inputs", true, torch.arange(len(true))), ("fitted images", fitted, match)):
    labels = read(x)
    counts = torch.bincount(labels, minlength=capture.num_classes)
    right = (labels[order] == truth.labels).double()
    print(f"{tag:13s} {counts.tolist()} L1 {int((counts - truth.counts).abs().sum())}, labels right {right.mean():.2f}"
          f" (images >= 20 dB: {right[score >= 20].mean():.2f} of {int((score >= 20).sum())}, the others "
          f"{right[score < 20].mean():.2f})")

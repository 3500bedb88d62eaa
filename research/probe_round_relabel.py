"""The labels of a finished round's run read from its fitted images (a probe): each image's input of the hidden
layer in place of the true inputs of ``research/probe_round_e5_labels.py``, the errors ē = (−ΔW/η) X⁺ and the label
argmax(p − g/E) of each (``labels.fc_inputs.hidden_errors``), beside the true inputs'; per-image agreement after
matching the images to the truth one to one, split at 20 dB.

    python research/probe_round_relabel.py RUN     (RUN: an output directory of gi run on a FedAvg round)
"""
import sys

import torch
from round_client import layer_labels
from safetensors.torch import load_file

from gi.analysis.metrics import match_images, psnr
from gi.capture import Capture, Truth

torch.set_num_threads(1)
run = sys.argv[1]
capture, truth = Capture.load(f"{run}/capture.safetensors"), Truth.load(f"{run}/truth.safetensors")
images = load_file(f"{run}/reconstructions.safetensors")["capture0"]
net = capture.model()
with torch.no_grad():
    fitted = net.body[0](net.normalize(images)).double()
    true = net.body[0](net.normalize(truth.images)).double()
match = match_images(images, truth.images)  # match[i]: the fitted image of true image i
score = psnr(images[match], truth.images)
print("true counts  ", truth.counts.tolist())
for tag, x, order in (("true inputs", true, torch.arange(len(true))), ("fitted images", fitted, match)):
    labels = layer_labels(capture, x)[2]
    counts = torch.bincount(labels, minlength=capture.num_classes)
    right = (labels[order] == truth.labels).double()
    print(f"{tag:13s} {counts.tolist()} L1 {int((counts - truth.counts).abs().sum())}, labels right {right.mean():.2f}"
          f" (images >= 20 dB: {right[score >= 20].mean():.2f} of {int((score >= 20).sum())}, the others "
          f"{right[score < 20].mean():.2f})")

"""``python -m project export``: the ONNX and pt2 graphs of a trained checkpoint take the test images as uint8
``(N, C, H, W)``, and files of any size decoded raw, and predict what ``predict`` wrote; bad input is one ``error:``
line."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from PIL import Image

from project.__main__ import main
from project.model import ImageClassifier
from project.toolkit.data.augmentation import to_model_input
from tests.support import fixtures

SMALL_NET = "--model.arch=tests.support.user_nets.sequential_convnet"
DOC = Path(__file__).resolve().parents[2] / "docs" / "export.md"


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.asarray(a) == np.asarray(b)).mean())


@pytest.fixture
def trained(tiny_args: list[str], tmp_path: Path) -> Path:
    """The tiny run's folder of runs, after one epoch of fit and a predict of its best checkpoint."""
    main(["fit", *tiny_args, SMALL_NET, "--trainer.max_epochs=1"])
    main(["predict", *tiny_args, SMALL_NET, "--ckpt_path=best"])
    return tmp_path / "lightning_logs"


def test_the_exported_graphs_predict_what_predict_wrote(trained: Path, tmp_path: Path) -> None:
    with open(next(trained.rglob("predictions.csv"))) as f:
        predicted = np.array([int(row["predicted"]) for row in csv.DictReader(f)])
    for fmt in ("onnx", "pt2"):
        main(["export", "--ckpt_path=best", f"--logs={trained}", f"--format={fmt}", f"--out={tmp_path / f'm.{fmt}'}"])
    images, _ = fixtures.ColourImages(image_size=32)._load(train=False)  # the test split, as predict read it
    images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # uint8 (N, H, W, C) -> (N, C, H, W)
    assert len(images) == len(predicted) == fixtures.TEST_IMAGES and len(set(predicted)) > 1  # not one class

    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in session.get_inputs()] == [("images", "tensor(uint8)")]
    onnx_logits = session.run(None, {"images": images})[0]
    assert onnx_logits.shape == (len(images), len(fixtures.LABEL_NAMES))
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert json.loads(props["label_names"]) == list(fixtures.LABEL_NAMES)

    extra = {"label_names.json": ""}
    program = torch.export.load(tmp_path / "m.pt2", extra_files=extra)
    assert json.loads(extra["label_names.json"]) == list(fixtures.LABEL_NAMES)
    with torch.no_grad():
        pt2_logits = program.module()(torch.from_numpy(images)).numpy()
        one = program.module()(torch.from_numpy(images[:1])).numpy()  # the batch dimension is dynamic
    np.testing.assert_allclose(one, pt2_logits[:1], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(onnx_logits, pt2_logits, rtol=1e-3, atol=1e-3)
    for logits in (onnx_logits, pt2_logits):
        assert agreement(logits.argmax(1), predicted) >= 0.99
    assert agreement(onnx_logits.argmax(1), pt2_logits.argmax(1)) >= 0.99


def test_the_exported_graph_resizes_and_crops_as_evaluation_does(tiny_args: list[str], tmp_path: Path) -> None:
    resizing = ["--data.resize_size=40", "--data.interpolation=bicubic"]  # as a torchvision weight name sets them
    main(["fit", *tiny_args, SMALL_NET, *resizing, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2"])
    logs = tmp_path / "lightning_logs"
    main(["export", "--ckpt_path=last", f"--logs={logs}", "--format=pt2", f"--out={tmp_path / 'm.pt2'}"])
    program = torch.export.load(tmp_path / "m.pt2").module()
    module = ImageClassifier.load_from_checkpoint(next(logs.rglob("last.ckpt")), weights_only=False).eval()
    mean, std = fixtures.ColourImages.mean, fixtures.ColourImages.std
    for shape in ((3, 3, 32, 32), (2, 3, 30, 45), (1, 3, 64, 41)):  # any size, landscape or portrait
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(shape[2]))
        with torch.no_grad():
            expected = module(to_model_input(images, 32, mean, std, resize_size=40, interpolation="bicubic"))
            got = program(images)
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-2)  # bicubic: a grey level off here and there
        assert torch.equal(got.argmax(1), expected.argmax(1))


def image_files(folder: Path) -> list[Path]:
    """Files of the tiny data set's colours at assorted sizes, landscape and portrait: colour and grey, JPEG and PNG."""
    folder.mkdir()
    rng = np.random.default_rng(3)
    sizes = [(40, 30), (80, 60), (30, 70), (32, 32), (33, 45), (75, 41), (20, 26), (64, 33)]  # (height, width)
    for n, (height, width) in enumerate(sizes):
        noise = rng.integers(0, 256, (height, width, 3))
        image = Image.fromarray((0.75 * fixtures.PALETTE[n] + 0.25 * noise).astype(np.uint8))
        (image.convert("L") if n % 3 == 2 else image).save(folder / f"{n}.{'png' if n % 2 else 'jpg'}", quality=90)
    return sorted(folder.iterdir())


def test_the_documented_snippet_takes_files_of_any_size_as_predict_does(
    trained: Path, tiny_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    files = image_files(tmp_path / "new_photos")
    folder = [
        "--data=project.data.ImageFolderDataModule",  # the checkpoint's data (fixtures.ColourImages) as files
        f"--data.data_dir={tmp_path / 'new_photos'}",
        "--data.image_size=32",
        f"--data.classes={json.dumps(fixtures.LABEL_NAMES)}",
        f"--data.mean={list(fixtures.ColourImages.mean)}",
        f"--data.std={list(fixtures.ColourImages.std)}",
    ]
    main(["predict", "--ckpt_path=best", *folder, *[option for option in tiny_args if option.startswith("--trainer.")]])
    with open(trained / "version_1" / "predictions.csv") as f:  # this predict's run, after the fit's version_0
        predicted = {row["file"]: row["predicted_name"] for row in csv.DictReader(f)}
    assert sorted(predicted) == [path.name for path in files] and len(set(predicted.values())) > 1
    monkeypatch.chdir(tmp_path)
    for fmt in ("onnx", "pt2"):
        main(["export", "--ckpt_path=best", f"--logs={trained}", f"--format={fmt}", f"--out=model.{fmt}"])

    snippet = next(code for code in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "onnxruntime" in code)
    capsys.readouterr()
    exec(snippet, {})  # docs/export.md's onnxruntime snippet, as written: it reads model.onnx and new_photos/
    assert dict(line.split() for line in capsys.readouterr().out.splitlines()) == predicted

    program = torch.export.load("model.pt2").module()
    for path in files:
        image = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)[None]  # (1, 3, H, W)
        with torch.no_grad():
            assert fixtures.LABEL_NAMES[int(program(image).argmax())] == predicted[path.name], path.name


def test_predict_and_the_graph_agree_on_photos_that_predict_decodes_at_a_reduced_scale(
    trained: Path, tiny_args: list[str], tmp_path: Path
) -> None:
    folder = tmp_path / "photos"  # 1.1-1.9 MP JPEGs: predict decodes them at 1/8 scale (Pillow draft), the graph whole
    folder.mkdir()
    rng = np.random.default_rng(5)
    for n, shape in enumerate([(1200, 900), (900, 1200), (1600, 1200), (1280, 960)] * 2):  # (width, height)
        grain = rng.integers(0, 256, (32, 32, 3))  # the training images' noise, at the scale the model sees
        pixels = (0.75 * fixtures.PALETTE[n] + 0.25 * grain).astype(np.uint8)
        Image.fromarray(pixels).resize(shape, Image.Resampling.NEAREST).save(folder / f"{n}.jpg", quality=90)
    data = ["--data=project.data.ImageFolderDataModule", f"--data.data_dir={folder}", "--data.image_size=32"]
    data += [f"--data.classes={json.dumps(fixtures.LABEL_NAMES)}", f"--data.mean={list(fixtures.ColourImages.mean)}"]
    data += [f"--data.std={list(fixtures.ColourImages.std)}"]
    main(["predict", "--ckpt_path=best", *data, *[option for option in tiny_args if option.startswith("--trainer.")]])
    with open(trained / "version_1" / "predictions.csv") as f:
        predicted = {row["file"]: row["predicted_name"] for row in csv.DictReader(f)}
    main(["export", "--ckpt_path=best", f"--logs={trained}", "--format=pt2", f"--out={tmp_path / 'm.pt2'}"])
    program = torch.export.load(tmp_path / "m.pt2").module()
    graph = {}
    for path in sorted(folder.iterdir()):
        image = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)[None]  # the whole file
        with torch.no_grad():
            graph[path.name] = fixtures.LABEL_NAMES[int(program(image).argmax())]
    assert sorted(graph) == sorted(predicted) and len(set(predicted.values())) > 1
    assert agreement([graph[name] for name in graph], [predicted[name] for name in graph]) >= 0.99


def test_a_checkpoint_without_normalisation_or_onnx_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "old.ckpt"  # its data module recorded no statistics
    data = {"mean": None, "std": None, "label_names": list(fixtures.LABEL_NAMES)}
    torch.save({"state_dict": {}, "datamodule_hyper_parameters": {"image_size": 32}, "ColourImages": data}, old)
    with pytest.raises(SystemExit) as exit_info:
        main(["export", f"--ckpt_path={old}", "--format=pt2", f"--out={tmp_path / 'm.pt2'}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --ckpt_path={old} records no mean/std and image_size of its data, which the graph builds in; "
        "export a single-file checkpoint of a fit by this version of the project"
    )
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(SystemExit):
        main(["export", "--format=onnx", f"--out={tmp_path / 'm.onnx'}"])
    line = "error: --format=onnx needs the onnx and onnxscript packages: pip install -e '.[export]'"
    assert capsys.readouterr().err.strip() == line
    assert not list(tmp_path.glob("m.*"))


@pytest.mark.slow  # three processes
@pytest.mark.parametrize(
    ("options", "line"),
    [
        (
            ["--ckpt_path=missing.ckpt", "--format=onnx", "--out=m.onnx"],
            "error: --ckpt_path=missing.ckpt: no such file",
        ),
        (["--format=tflite", "--out=m.tflite"], "error: argument --format: invalid choice: 'tflite' (choose from"),
        (["--format=pt2", "--out=no/such/folder/m.pt2"], "error: --out no/such/folder/m.pt2: cannot write into"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, options: list[str], line: str) -> None:
    command = [sys.executable, "-m", "project", "export", *options]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith(line), result.stderr
    assert not list(tmp_path.iterdir())

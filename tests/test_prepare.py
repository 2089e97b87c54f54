"""Tests for cheaptrain.prepare on tiny synthetic archives (one e2e test on the real shared archive)."""

import errno
import gzip
import hashlib
import http.server
import importlib.util
import io
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from cheaptrain import UserError, prepare
from cheaptrain.data import DataError, load_split
from cheaptrain.prepare import DATASETS, prepare_dataset, resolve_source, write_prepared

from conftest import REPO, run_stage

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_CLASS = {"train": 3, "test": 2}
SHARED_ARCHIVE = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "cifar10-jpg.tar.gz"
SHARED_SHA256 = "4408dd73cc7e0535b6083c86689cc2445cf903efc6b3341722a3dbaa6e8c8b77"

Images = dict[str, dict[str, list[np.ndarray]]]  # split -> class -> images


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's shell may set these; every test states its own environment.
    for var in ("CIFAR10_SOURCE", "CIFAR100_SOURCE", "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)


# --- building archives -------------------------------------------------------------------------------------


def sample_images(seed: int = 0) -> Images:
    rng = np.random.default_rng(seed)
    return {
        split: {cls: [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(n)] for cls in CIFAR10_CLASSES}
        for split, n in PER_CLASS.items()
    }


def encode(image: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=fmt)
    return buffer.getvalue()


def folder_entries(images: Images, root: str = "", fmt: str = "PNG") -> dict[str, bytes]:
    prefix = f"{root}/" if root else ""
    return {
        f"{prefix}{split}/{cls}/{i:04d}.{fmt.lower()}": encode(image, fmt)
        for split, by_class in images.items()
        for cls, items in by_class.items()
        for i, image in enumerate(items)
    }


def expected_arrays(images: Images) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {
        split: (
            np.stack([image for cls in CIFAR10_CLASSES for image in by_class[cls]]),
            np.array([label for label, cls in enumerate(CIFAR10_CLASSES) for _ in by_class[cls]]),
        )
        for split, by_class in images.items()
    }


def write_archive(path: Path, entries: dict[str, bytes]) -> Path:
    """Write entries as .zip, .tar or .tar.gz/.tgz (by suffix), shuffled: results must not depend on order."""
    names = list(entries)
    np.random.default_rng(1).shuffle(names)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".zip":
        with zipfile.ZipFile(path, "w") as zf:
            for name in names:
                zf.writestr(name, entries[name])
    else:
        with tarfile.open(path, "w" if path.suffix == ".tar" else "w:gz") as tf:
            for name in names:
                member = tarfile.TarInfo(name)
                member.size = len(entries[name])
                tf.addfile(member, io.BytesIO(entries[name]))
    return path


def py2_pickle(obj: object) -> bytes:
    # Protocol 2 with numpy 1.x module names, like the official (Python 2) batches.
    return pickle.dumps(obj, protocol=2).replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


def official_entries(dataset: str, seed: int = 0) -> tuple[dict[str, bytes], dict, list[str]]:
    """A tiny official python-format archive: its members, the expected arrays and the class names."""
    info = DATASETS[dataset]
    rng = np.random.default_rng(seed)
    classes = CIFAR10_CLASSES if dataset == "cifar10" else [f"class_{i:02d}" for i in range(info.num_classes)]
    entries = {f"{info.folder}/{info.meta_file}": py2_pickle({info.names_key: classes})}
    expected = {}
    for split, files in (("train", info.train_files), ("test", info.test_files)):
        xs, ys = [], []
        for name in files:
            x = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
            y = rng.integers(0, info.num_classes, 4)
            rows = x.transpose(0, 3, 1, 2).reshape(4, 3072)  # official rows: the R, G and B planes
            entries[f"{info.folder}/{name}"] = py2_pickle({"data": rows, info.label_key: y.tolist()})
            xs.append(x)
            ys.append(y)
        expected[split] = (np.concatenate(xs), np.concatenate(ys))
    return entries, expected, classes


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def tiny_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        split: (rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), np.arange(n, dtype=np.int64) % 10)
        for split, n in (("train", 20), ("test", 10))
    }


def assert_fails_cleanly(
    tmp_path: Path, source: str, match: str, dataset: str = "cifar10", **kwargs: object
) -> DataError:
    """DataError (one paragraph); no output where there was none, a previous complete output untouched."""
    fresh, previous = tmp_path / "fresh", tmp_path / "previous"
    if not previous.exists():
        write_prepared(previous, tiny_splits(), CIFAR10_CLASSES, {"run": "previous"})
    before = snapshot(previous)
    for out in (fresh, previous):
        with pytest.raises(DataError, match=match) as caught:
            prepare_dataset(dataset, source, out, tmp_path / "cache", progress=False, **kwargs)
    assert isinstance(caught.value, UserError)
    assert "\n" not in str(caught.value)
    assert not fresh.exists()
    assert snapshot(previous) == before
    assert leftovers(tmp_path) == []
    return caught.value


def assert_retry_succeeds(tmp_path: Path, source: str, dataset: str = "cifar10", **kwargs: object) -> dict:
    manifest = prepare_dataset(dataset, source, tmp_path / "previous", tmp_path / "cache", progress=False, **kwargs)
    assert json.loads((tmp_path / "previous" / "manifest.json").read_text()) == manifest
    assert load_split(tmp_path / "previous", "test").images.shape[1:] == (32, 32, 3)
    assert leftovers(tmp_path) == []
    return manifest


# --- decoding ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz", ".tgz", ".zip"])
@pytest.mark.parametrize("root", ["", "cifar10-png"])
def test_image_folder_archive_gives_exact_pixels_labels_and_class_order(tmp_path: Path, suffix: str, root: str) -> None:
    images = sample_images()
    archive = write_archive(tmp_path / f"src{suffix}", folder_entries(images, root))
    out = tmp_path / "prepared"
    manifest = prepare_dataset("cifar10", str(archive), out, tmp_path / "cache", progress=False)
    assert manifest["layout"] == "image-folder"
    for split, (x, y) in expected_arrays(images).items():
        loaded = load_split(out, split)
        assert loaded.images.dtype == np.uint8 and loaded.labels.dtype == np.int64
        np.testing.assert_array_equal(loaded.images, x)
        np.testing.assert_array_equal(loaded.labels, y)
        assert loaded.classes == CIFAR10_CLASSES
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.npz", "train.npz"]
    assert leftovers(tmp_path) == []


def test_jpeg_images_decode(tmp_path: Path) -> None:
    # Flat colours survive JPEG almost exactly.
    images = {
        split: {
            cls: [np.full((32, 32, 3), (20 * c + i, 100, 200 - 15 * c), dtype=np.uint8) for i in range(n)]
            for c, cls in enumerate(CIFAR10_CLASSES)
        }
        for split, n in PER_CLASS.items()
    }
    archive = write_archive(tmp_path / "src.tar.gz", folder_entries(images, "cifar10-jpg", fmt="JPEG"))
    prepare_dataset("cifar10", str(archive), tmp_path / "out", tmp_path / "cache", progress=False)
    for split, (x, y) in expected_arrays(images).items():
        loaded = load_split(tmp_path / "out", split)
        assert np.abs(loaded.images.astype(int) - x).max() <= 3
        np.testing.assert_array_equal(loaded.labels, y)


def test_manifest_records_source_checksum_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = write_archive(tmp_path / "data" / "src.zip", folder_entries(sample_images()))
    monkeypatch.chdir(tmp_path)
    manifest = prepare_dataset("cifar10", "data/src.zip", tmp_path / "out", tmp_path / "cache", progress=False)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest
    assert manifest["dataset"] == "cifar10"
    assert manifest["source"] == {"param": "data/src.zip", "env": None}
    assert manifest["layout"] == "image-folder"
    assert manifest["archive"]["sha256"] == sha256_of(archive)
    assert manifest["classes"] == CIFAR10_CLASSES
    assert manifest["splits"] == {
        "train": {"count": 30, "per_class": dict.fromkeys(CIFAR10_CLASSES, 3)},
        "test": {"count": 20, "per_class": dict.fromkeys(CIFAR10_CLASSES, 2)},
    }
    assert manifest["archive"]["file"] == "src.zip"
    assert "train_subset" not in manifest  # the same manifest as before the param existed: DVC sees the same data


def test_train_size_keeps_the_first_images_of_each_class_in_order_and_the_whole_test_split(tmp_path: Path) -> None:
    images = sample_images()
    archive = write_archive(tmp_path / "src.tar", folder_entries(images))
    manifest = prepare_dataset("cifar10", str(archive), tmp_path / "out", tmp_path / "cache", progress=False,
                               train_size=20)  # fmt: skip
    first_two = {"train": {cls: items[:2] for cls, items in images["train"].items()}, "test": images["test"]}
    for split, (x, y) in expected_arrays(first_two).items():
        loaded = load_split(tmp_path / "out", split)
        np.testing.assert_array_equal(loaded.images, x)
        np.testing.assert_array_equal(loaded.labels, y)
    assert manifest["train_subset"] == {"train_size": 20, "archive_train_count": 30}
    assert manifest["splits"]["train"] == {"count": 20, "per_class": dict.fromkeys(CIFAR10_CLASSES, 2)}
    assert manifest["splits"]["test"]["count"] == 20


@pytest.mark.parametrize(
    ("train_size", "match"),
    [
        (0, "train_size: 0 is invalid; accepted: null"),
        (-10, "train_size: -10 is invalid"),
        ("half", "train_size: 'half' is invalid"),
        (True, "train_size: True is invalid"),
        (25, "train_size: 25 is not a multiple of its 10 classes, which keep the same number of images each; e.g. 20"),
        (40, "train_size: 40 asks for 4 images of each class, but the archive's training split has 3 of its smallest "
             "class; at most 30"),
    ],
)  # fmt: skip
def test_a_bad_train_size_fails_cleanly_then_a_good_one_succeeds(tmp_path: Path, train_size, match: str) -> None:
    archive = write_archive(tmp_path / "src.tar", folder_entries(sample_images()))
    assert_fails_cleanly(tmp_path, str(archive), re.escape(match), train_size=train_size)
    assert assert_retry_succeeds(tmp_path, str(archive), train_size=30)["splits"]["train"]["count"] == 30


def test_same_data_gives_byte_identical_output(tmp_path: Path) -> None:
    """DVC hashes the prepared folder: a re-run on the same archive must not look like new data."""
    archive = write_archive(tmp_path / "src.tar", folder_entries(sample_images()))
    prepare_dataset("cifar10", str(archive), tmp_path / "a", tmp_path / "cache", progress=False)
    time.sleep(2.1)  # zip timestamps have 2-second resolution
    prepare_dataset("cifar10", str(archive), tmp_path / "b", tmp_path / "cache", progress=False)
    for name in ("train.npz", "test.npz", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_official_python_archive_with_explicit_sha256(tmp_path: Path, dataset: str) -> None:
    entries, expected, classes = official_entries(dataset)
    archive = write_archive(tmp_path / f"{dataset}-python.tar.gz", entries)
    out = tmp_path / "out"
    manifest = prepare_dataset(
        dataset, str(archive), out, tmp_path / "cache", sha256=sha256_of(archive), progress=False
    )
    assert manifest["layout"] == "official-python"
    assert manifest["archive"]["sha256"] == sha256_of(archive)
    assert manifest["classes"] == classes
    for split, (x, y) in expected.items():
        loaded = load_split(out, split)
        np.testing.assert_array_equal(loaded.images, x)  # CHW rows came back as HWC
        np.testing.assert_array_equal(loaded.labels, y)
        assert loaded.classes == classes


# --- sources -----------------------------------------------------------------------------------------------


def test_resolve_source_keeps_torchvision_and_urls() -> None:
    for source in ["torchvision", "https://example.org/c.tar.gz", "http://h/a.zip", "file:///data/a.tar"]:
        assert resolve_source("cifar10", source) == source


def test_resolve_source_makes_relative_paths_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_source("cifar10", "data/a.tar") == str(tmp_path / "data" / "a.tar")
    assert resolve_source("cifar10", "/abs/a.tar") == "/abs/a.tar"
    # Under DVC the stage may run in a temporary copy: relative paths mean relative to the real repo.
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    monkeypatch.chdir("/")
    expected = str(tmp_path / "shared" / "datasets" / "a.tar.gz")
    assert resolve_source("cifar10", "../shared/datasets/a.tar.gz") == expected


def test_environment_variable_overrides_the_param(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CIFAR10_SOURCE", "https://mirror.example/c10.tar.gz")
    assert resolve_source("cifar10", "torchvision") == "https://mirror.example/c10.tar.gz"
    assert resolve_source("cifar100", "torchvision") == "torchvision"  # each dataset has its own variable
    monkeypatch.setenv("CIFAR10_SOURCE", "")
    assert resolve_source("cifar10", "torchvision") == "torchvision"  # empty means unset

    archive = write_archive(tmp_path / "repo" / "src.tar", folder_entries(sample_images()))
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "repo"))
    monkeypatch.setenv("CIFAR10_SOURCE", "src.tar")
    manifest = prepare_dataset("cifar10", "torchvision", tmp_path / "out", tmp_path / "cache", progress=False)
    assert manifest["source"] == {"param": "torchvision", "env": "src.tar"}
    assert manifest["archive"]["sha256"] == sha256_of(archive)


def test_a_sha256_checks_the_params_archive_not_another_one_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # params.quick.yaml pins the shared archive's sha256; CIFAR10_SOURCE=<another archive> must still prepare
    pinned = write_archive(tmp_path / "pinned.tar", folder_entries(sample_images(0)))
    other = write_archive(tmp_path / "other.tar", folder_entries(sample_images(1)))
    monkeypatch.setenv("CIFAR10_SOURCE", str(other))
    manifest = prepare_dataset(
        "cifar10", str(pinned), tmp_path / "out", tmp_path / "cache", sha256=sha256_of(pinned), progress=False
    )
    assert manifest["archive"]["sha256"] == sha256_of(other)
    manifest = prepare_dataset("cifar10", " ", tmp_path / "out", tmp_path / "cache", sha256="0" * 64, progress=False)
    assert manifest["archive"]["sha256"] == sha256_of(other)  # no param source: the variable's archive, unchecked
    # the archive the param names, whichever way: its sha256 is checked
    assert_fails_cleanly(tmp_path, str(other), "Checksum mismatch", sha256=sha256_of(pinned))


def test_a_source_from_the_environment_warns_that_the_params_sha256_is_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pinned = write_archive(tmp_path / "pinned.tar", folder_entries(sample_images(0)))
    other = write_archive(tmp_path / "other.tar", folder_entries(sample_images(1)))

    def prepare_pinned(sha256: str | None) -> None:
        prepare_dataset("cifar10", str(pinned), tmp_path / "out", tmp_path / "cache", sha256=sha256, progress=False)

    monkeypatch.setenv("CIFAR10_SOURCE", str(other))
    prepare_pinned(sha256_of(pinned))
    assert capsys.readouterr().err == (
        f"warning: CIFAR10_SOURCE names the source {other}: the sha256 of params (download.cifar10.sha256) is not "
        "checked for that source\n"
    )
    prepare_pinned(None)  # no sha256 to drop
    monkeypatch.setenv("CIFAR10_SOURCE", str(pinned))  # the params' own archive: checked
    prepare_pinned(sha256_of(pinned))
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"source": 5}, "download.cifar10.source: 5 is invalid"),
        ({"source": "torchvision", "sha256": 5}, "download.cifar10.sha256: 5 is invalid"),
        (5, "download.cifar10: 5 is invalid"),
    ],
)
def test_the_download_stage_names_a_param_of_the_wrong_type(tmp_path: Path, section: object, message: str) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["download"]["cifar10"] = section
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--dataset", "cifar10", "--no-mlflow", "--out", "prepared", "--cache", "raw"]
    result = run_stage(REPO / "stages" / "download.py", *args, cwd=tmp_path)  # fails before any work: in this process
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "raw").exists()


TYPOS = {  # a typo must not pass unseen: `sha_256:` would turn the archive's check off, `trainsize:` and a misspelt
    # section (its train_size ignored) train on every image
    **{f"download.{d}.{key}": (d, key) for d, key in [("cifar10", "sha_256"), ("cifar10", "trainsize"),
                                                      ("cifar10", "sorce"), ("cifar100", "sorce")]},
    **{f"download.{name}": (name, "train_size") for name in ["cifar-10", "CIFAR10", "cifar_100"]},
}  # fmt: skip


@pytest.mark.parametrize("typo", TYPOS)
def test_the_download_stage_refuses_an_unknown_key_or_section_before_any_download(tmp_path: Path, typo: str) -> None:
    archive = write_archive(tmp_path / "src.tar", folder_entries(sample_images()))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["download"]["cifar10"]["source"] = str(archive)
    section, key = TYPOS[typo]
    params["download"].setdefault(section, {})[key] = 5000
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = ["--dataset", "cifar10", "--no-mlflow", "--out", "prepared", "--cache", "raw"]
    result = run_stage(REPO / "stages" / "download.py", *args, cwd=tmp_path)
    assert result.returncode == 2
    accepted = "datasets, cifar10, cifar100" if typo.count(".") == 1 else "source, sha256, train_size"
    assert result.stderr == f"error: {typo}: unknown; accepted: {accepted}\n"
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "raw").exists()


@pytest.mark.parametrize("name", ["params.yaml", "params.quick.yaml"])
def test_the_params_files_download_sections_are_accepted(name: str) -> None:
    spec = importlib.util.spec_from_file_location("download_stage", REPO / "stages" / "download.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    params = yaml.safe_load((REPO / name).read_text())
    for dataset in params["download"]["datasets"]:
        assert stage.download_settings(params, dataset) == params["download"][dataset]


def test_unknown_dataset_lists_the_accepted_names(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cifar10, cifar100"):
        resolve_source("mnist", "torchvision")
    with pytest.raises(DataError, match="cifar10, cifar100"):
        prepare_dataset("mnist", "torchvision", tmp_path / "out", tmp_path / "cache", progress=False)
    assert not (tmp_path / "out").exists()


def test_file_url_is_downloaded_into_the_cache_and_reused(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "src" / "tiny.tar.gz", folder_entries(sample_images()))
    sha, cache = sha256_of(archive), tmp_path / "cache"
    manifest = prepare_dataset("cifar10", archive.as_uri(), tmp_path / "out", cache, sha256=sha, progress=False)
    assert manifest["source"]["param"] == archive.as_uri()
    assert manifest["archive"]["sha256"] == sha
    assert [p.name for p in cache.iterdir()] == ["tiny.tar.gz"]  # no temporary download left behind
    assert (cache / "tiny.tar.gz").read_bytes() == archive.read_bytes()
    archive.unlink()  # a cached copy that verifies is used without downloading again
    prepare_dataset("cifar10", archive.as_uri(), tmp_path / "out2", cache, sha256=sha, progress=False)
    assert snapshot(tmp_path / "out2")["train.npz"] == snapshot(tmp_path / "out")["train.npz"]


def test_missing_file_url(tmp_path: Path) -> None:
    url = (tmp_path / "nowhere.tar.gz").as_uri()
    error = assert_fails_cleanly(tmp_path, url, "names no existing file")
    assert "CIFAR10_SOURCE" in str(error)
    write_archive(tmp_path / "nowhere.tar.gz", folder_entries(sample_images()))
    assert_retry_succeeds(tmp_path, url)


def test_unreachable_url_says_offline_and_how_to_use_a_local_archive(tmp_path: Path) -> None:
    error = str(assert_fails_cleanly(tmp_path, "http://127.0.0.1:9/x.tar.gz", "offline"))
    assert "CIFAR10_SOURCE" in error and "download.cifar10.source" in error
    assert "../shared/datasets/cifar10-jpg.tar.gz" in error
    assert list((tmp_path / "cache").iterdir()) == []


class _ArchiveHandler(http.server.BaseHTTPRequestHandler):
    """Serves server.body; with server.truncate it promises the whole body but sends half and hangs up (without
    server.send_length it promises nothing: only the archive itself can tell that it is incomplete)."""

    def do_GET(self) -> None:
        body = self.server.body  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", getattr(self.server, "content_type", "application/gzip"))
        if getattr(self.server, "send_length", True):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if self.server.truncate else body)  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ArchiveHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_truncated_download_leaves_nothing_and_a_retry_succeeds(tmp_path: Path, http_server) -> None:
    archive = write_archive(tmp_path / "tiny.tar.gz", folder_entries(sample_images()))
    http_server.body, http_server.truncate = archive.read_bytes(), True
    url = f"http://127.0.0.1:{http_server.server_port}/tiny.tar.gz"
    assert_fails_cleanly(tmp_path, url, "tiny.tar.gz")
    assert list((tmp_path / "cache").iterdir()) == []  # neither the partial file nor a temporary one
    http_server.truncate = False
    manifest = assert_retry_succeeds(tmp_path, url)
    assert manifest["archive"]["sha256"] == sha256_of(archive)


def test_truncated_download_of_unknown_length_leaves_nothing_in_the_cache(tmp_path: Path, http_server) -> None:
    archive = write_archive(tmp_path / "tiny.tar.gz", folder_entries(sample_images()))
    http_server.body, http_server.truncate, http_server.send_length = archive.read_bytes(), True, False
    url = f"http://127.0.0.1:{http_server.server_port}/tiny.tar.gz"
    assert_fails_cleanly(tmp_path, url, "truncated or corrupt")
    assert list((tmp_path / "cache").iterdir()) == []  # the incomplete archive is not kept as if it were good
    http_server.truncate = False
    assert_retry_succeeds(tmp_path, url)


def test_a_web_page_served_instead_of_the_archive_is_named_by_its_url(tmp_path: Path, http_server) -> None:
    http_server.body, http_server.truncate = b"<html><body>Download CIFAR-10 here</body></html>", False
    url = f"http://127.0.0.1:{http_server.server_port}/cifar-10.tar.gz"
    http_server.content_type = "text/html; charset=utf-8"
    with pytest.raises(DataError, match=rf"{re.escape(url)} is a web page \(text/html\), not an archive"):
        prepare_dataset("cifar10", url, tmp_path / "out", tmp_path / "cache", progress=False)
    http_server.content_type = "application/octet-stream"  # a server that does not say: the archive tells
    with pytest.raises(DataError, match=rf"What {re.escape(url)} sent is unusable \(the download was deleted\)"):
        prepare_dataset("cifar10", url, tmp_path / "out", tmp_path / "cache", progress=False)
    assert list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "out").exists()


def test_the_partial_download_of_a_killed_run_is_removed(tmp_path: Path, http_server) -> None:
    archive = write_archive(tmp_path / "tiny.tar.gz", folder_entries(sample_images()))
    http_server.body, http_server.truncate = archive.read_bytes(), False
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / "cache" / f".tiny.tar.gz.download-{dead.stdout.strip()}"
    stale.parent.mkdir()
    stale.write_bytes(b"the first half of an archive")
    url = f"http://127.0.0.1:{http_server.server_port}/tiny.tar.gz"
    prepare_dataset("cifar10", url, tmp_path / "out", tmp_path / "cache", progress=False)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["tiny.tar.gz"]


class _FakeCIFAR10:
    """Stands in for torchvision.datasets.CIFAR10: writes an 'archive' into root, as torchvision does."""

    def __init__(self, root: str, train: bool, download: bool) -> None:
        assert download
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / "cifar-10-python.tar.gz").write_bytes(b"official archive")
        n = 20 if train else 10
        self.data = np.full((n, 32, 32, 3), 7 if train else 9, dtype=np.uint8)
        self.targets = [i % 10 for i in range(n)]
        self.classes = list(CIFAR10_CLASSES)


def test_torchvision_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("torchvision.datasets")
    monkeypatch.setattr(datasets, "CIFAR10", _FakeCIFAR10)
    manifest = prepare_dataset("cifar10", "torchvision", tmp_path / "out", tmp_path / "cache", progress=False)
    assert manifest["layout"] == "torchvision"
    assert manifest["archive"] == {
        "file": "cifar-10-python.tar.gz",
        "url": DATASETS["cifar10"].url,
        "md5": DATASETS["cifar10"].md5,
        "sha256": hashlib.sha256(b"official archive").hexdigest(),
    }
    train = load_split(tmp_path / "out", "train")
    assert train.images.shape == (20, 32, 32, 3) and (train.images == 7).all()
    assert train.labels.tolist() == [i % 10 for i in range(20)] and train.classes == CIFAR10_CLASSES


def test_torchvision_failure_says_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("torchvision.datasets")

    def offline(**kwargs: object) -> None:
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(datasets, "CIFAR10", offline)
    error = str(assert_fails_cleanly(tmp_path, "torchvision", "offline"))
    assert "CIFAR10_SOURCE" in error and "download.cifar10.source" in error
    assert socket.getdefaulttimeout() is None  # the temporary download timeout was put back


def test_dataset_table_matches_torchvision() -> None:
    datasets = pytest.importorskip("torchvision.datasets")
    for info in DATASETS.values():
        tv = getattr(datasets, info.torchvision_class)
        assert (tv.url, tv.filename, tv.tgz_md5, tv.base_folder) == (info.url, info.filename, info.md5, info.folder)
        assert [name for name, _ in tv.train_list] == list(info.train_files)
        assert [name for name, _ in tv.test_list] == list(info.test_files)
        assert (tv.meta["filename"], tv.meta["key"]) == (info.meta_file, info.names_key)


# --- errors ------------------------------------------------------------------------------------------------


def test_missing_local_path_then_retry(tmp_path: Path) -> None:
    path = tmp_path / "missing.tar.gz"
    error = str(assert_fails_cleanly(tmp_path, str(path), "does not exist"))
    assert str(path) in error and "CIFAR10_SOURCE" in error
    write_archive(path, folder_entries(sample_images()))
    assert_retry_succeeds(tmp_path, str(path))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        pytest.param("garbage.tar.gz", lambda p: p.write_bytes(b"not an archive\n" * 100), id="not-an-archive"),
        pytest.param("half.tar.gz", _truncate, id="truncated-tar.gz"),
        pytest.param("half.tar", _truncate, id="truncated-tar"),
        pytest.param("half.zip", _truncate, id="truncated-zip"),
    ],
)
def test_unreadable_archive_then_retry(tmp_path: Path, name: str, damage: Callable[[Path], None]) -> None:
    path = write_archive(tmp_path / name, folder_entries(sample_images()))
    damage(path)
    assert str(path) in str(assert_fails_cleanly(tmp_path, str(path), "truncated or corrupt"))
    write_archive(path, folder_entries(sample_images()))
    assert_retry_succeeds(tmp_path, str(path))


@pytest.mark.parametrize("damage", ["pixel", "crc", "length"])
def test_a_tar_gz_that_fails_its_gzip_check_is_refused_then_retry(tmp_path: Path, damage: str) -> None:
    """tarfile stops at the end-of-archive marker, before gzip's trailer: a flipped bit must still be caught."""
    images = sample_images()
    tar = write_archive(tmp_path / "src.tar", folder_entries(images, fmt="PPM")).read_bytes()  # raw, unchecked pixels
    good = gzip.compress(tar, compresslevel=0, mtime=0)  # stored deflate blocks: the pixels lie there verbatim
    row = images["train"]["cat"][1][5].tobytes()  # 32 pixels of one image
    where = {"pixel": good.find(row), "crc": len(good) - 8, "length": len(good) - 4}[damage]  # trailer: CRC, length
    assert where > 0
    data = bytearray(good)
    data[where] ^= 1
    archive = tmp_path / "src.tar.gz"
    archive.write_bytes(data)
    error = str(assert_fails_cleanly(tmp_path, str(archive), "is corrupt: its compressed stream fails its checksum"))
    assert str(archive) in error and "BadGzipFile" in error
    archive.write_bytes(good)
    assert_retry_succeeds(tmp_path, str(archive))
    train = load_split(tmp_path / "previous", "train").images
    np.testing.assert_array_equal(train, expected_arrays(images)["train"][0])


def test_a_tar_cut_at_a_member_boundary_is_refused_as_incomplete_then_retry(tmp_path: Path) -> None:
    """Cut between two members, an uncompressed tar reads as a complete one with fewer images."""
    archive = write_archive(tmp_path / "src.tar", folder_entries(sample_images()))
    with tarfile.open(archive) as tf:
        last = tf.getmembers()[-1]
    whole = archive.read_bytes()
    archive.write_bytes(whole[: last.offset])
    split, cls = last.name.split("/")[:2]
    kind, n = ("training", PER_CLASS["train"]) if split == "train" else ("test", PER_CLASS["test"])
    match = f"the archive is incomplete or not CIFAR's: class {cls} has {n - 1} {kind} images, the others {n}"
    assert str(archive) in str(assert_fails_cleanly(tmp_path, str(archive), re.escape(match)))
    archive.write_bytes(whole)
    assert_retry_succeeds(tmp_path, str(archive))


def test_checksum_mismatch_names_both_checksums_then_retry(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "src.tar.gz", folder_entries(sample_images()))
    wrong = "0" * 64
    error = str(assert_fails_cleanly(tmp_path, str(archive), "Checksum mismatch", sha256=wrong))
    assert wrong in error and sha256_of(archive) in error
    assert_retry_succeeds(tmp_path, str(archive), sha256=sha256_of(archive))


def test_official_archive_is_md5_checked_without_sha256(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "cifar-10-python.tar.gz", official_entries("cifar10")[0])
    error = str(assert_fails_cleanly(tmp_path, str(archive), "md5"))
    assert DATASETS["cifar10"].md5 in error and hashlib.md5(archive.read_bytes()).hexdigest() in error
    assert_retry_succeeds(tmp_path, str(archive), sha256=sha256_of(archive))


def test_official_archive_of_the_other_dataset(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "cifar-100-python.tar.gz", official_entries("cifar100")[0])
    assert_fails_cleanly(
        tmp_path, str(archive), "official cifar100 archive, but the dataset is cifar10", sha256=sha256_of(archive)
    )


class _RunsCode:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned",))


def test_pickles_in_an_archive_cannot_run_code(tmp_path: Path) -> None:
    entries = official_entries("cifar10")[0]
    entries["cifar-10-batches-py/batches.meta"] = pickle.dumps({"label_names": _RunsCode()}, protocol=2)
    archive = write_archive(tmp_path / "evil.tar.gz", entries)
    assert_fails_cleanly(tmp_path, str(archive), "unexpected object posix.system", sha256=sha256_of(archive))


def _without(*prefixes: str) -> Callable[[dict[str, bytes]], dict[str, bytes]]:
    return lambda entries: {k: v for k, v in entries.items() if not k.startswith(prefixes)}


def _with(name: str, data: bytes) -> Callable[[dict[str, bytes]], dict[str, bytes]]:
    return lambda entries: {**entries, name: data}


_PNG = encode(np.zeros((32, 32, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        pytest.param(_without("test/"), "has no test/ folder", id="no-test-split"),
        pytest.param(_without("train/"), "has no train/ folder", id="no-train-split"),
        pytest.param(
            _without("test/truck/"),
            r"different class folders in train/ and test/: only in train/: \['truck'\]",
            id="class-missing-in-test",
        ),
        pytest.param(
            _without("train/truck/", "test/truck/"), "has 9 class folders, but cifar10 has 10", id="wrong-class-count"
        ),
        pytest.param(
            lambda entries: {"readme.txt": b"hello", "images/0.png": _PNG}, "neither known layout", id="unknown-layout"
        ),
        pytest.param(
            _without("train/ship/0001.png", "train/truck/0000.png", "train/truck/0002.png"),
            "class ship has 2 training images, class truck has 1 training images, the others 3",
            id="classes-of-different-sizes",
        ),
        pytest.param(
            _with("test/dog/0002.png", _PNG), "class dog has 3 test images, the others 2", id="one-image-too-many"
        ),
        pytest.param(
            lambda entries: {f"{root}/{k}": v for k, v in entries.items() for root in ("a", "b")},
            "several top-level folders",
            id="two-top-level-folders",
        ),
        pytest.param(
            _with("train/cat/0000.png", encode(np.zeros((32, 31, 3), dtype=np.uint8))),
            "image train/cat/0000.png is 31x32 RGB, but CIFAR images are 32x32 RGB",
            id="not-32x32",
        ),
        pytest.param(
            _with("test/dog/0000.png", encode(np.zeros((32, 32), dtype=np.uint8))),
            "image test/dog/0000.png is 32x32 L, but",
            id="grayscale",
        ),
        pytest.param(
            _with("train/cat/0000.png", b"not an image"),
            "cannot decode the image train/cat/0000.png",
            id="not-an-image",
        ),
        pytest.param(
            _with("test/cat/0000.png", _PNG[: len(_PNG) // 2]),
            "cannot decode the image test/cat/0000.png",
            id="truncated-image",
        ),
    ],
)
def test_bad_layout_or_image_then_retry(tmp_path: Path, damage: Callable, match: str) -> None:
    good = folder_entries(sample_images())
    archive = write_archive(tmp_path / "src.zip", damage(good))
    assert_fails_cleanly(tmp_path, str(archive), match)
    write_archive(archive, good)
    assert_retry_succeeds(tmp_path, str(archive))


def test_hidden_files_are_ignored(tmp_path: Path) -> None:
    entries = {**folder_entries(sample_images()), "train/cat/.DS_Store": b"junk", "test/cat/._0000.png": b"x"}
    archive = write_archive(tmp_path / "src.zip", entries)
    manifest = prepare_dataset("cifar10", str(archive), tmp_path / "out", tmp_path / "cache", progress=False)
    assert manifest["splits"]["train"]["count"] == 30


# --- atomic output and loading -----------------------------------------------------------------------------


def test_interrupted_write_leaves_nothing_or_the_previous_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = tmp_path / "previous"
    write_prepared(previous, tiny_splits(), CIFAR10_CLASSES, {"run": 1})
    before = snapshot(previous)
    real_save, calls = prepare._save_npz, []

    def save_then_interrupt(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) % 2 == 0:  # the second file of each run
            raise KeyboardInterrupt
        real_save(*args, **kwargs)

    monkeypatch.setattr(prepare, "_save_npz", save_then_interrupt)
    for out in (previous, tmp_path / "fresh"):
        with pytest.raises(KeyboardInterrupt):
            write_prepared(out, tiny_splits(seed=1), CIFAR10_CLASSES, {"run": 2})
    assert snapshot(previous) == before
    assert not (tmp_path / "fresh").exists()
    assert leftovers(tmp_path) == []


def test_an_output_or_cache_that_cannot_be_written_is_one_error_line(tmp_path: Path) -> None:
    archive = write_archive(tmp_path / "src.tar", folder_entries(sample_images()))
    (tmp_path / "afile").write_text("not a folder")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    stage = REPO / "stages" / "download.py"
    for source, args, message in [
        (str(archive), ["--out", "afile"], f"error: Cannot write the prepared data to {Path('afile', 'cifar10')} "),
        (archive.as_uri(), ["--cache", "afile/c"], f"error: Cannot use {Path('afile', 'c')} as the download cache "),
    ]:
        params["download"]["cifar10"]["source"] = source
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        result = run_stage(stage, "--dataset", "cifar10", "--no-mlflow", *args, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
        assert "File exists" in result.stderr or "Not a directory" in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert not (tmp_path / "data").exists()  # the default of the other folder: left before anything was written
    assert leftovers(tmp_path) == []


def test_an_output_that_cannot_be_written_is_found_before_the_archive_is_read(tmp_path: Path) -> None:
    garbage = tmp_path / "src.tar"
    garbage.write_bytes(b"not an archive")  # read first, it would be the error
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(DataError, match="Cannot write the prepared data to") as caught:
        prepare_dataset("cifar10", str(garbage), tmp_path / "afile" / "sub" / "cifar10", tmp_path / "cache")
    assert f"Not a directory: '{tmp_path / 'afile'}'" in str(caught.value)
    assert not (tmp_path / "cache").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_download_into_a_full_disk_says_so_not_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = write_archive(tmp_path / "src" / "tiny.tar.gz", folder_entries(sample_images()))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / f".tiny.tar.gz.download-{os.getpid()}").symlink_to("/dev/full")  # every write: ENOSPC, from the kernel
    monkeypatch.setattr(prepare, "_remove_stale", lambda *args: None)  # which would remove it as this process's own
    with pytest.raises(DataError, match=f"Cannot write the download of {archive.as_uri()} into {cache} ") as caught:
        prepare_dataset("cifar10", archive.as_uri(), tmp_path / "out", cache, progress=False)
    assert "No space left on device" in str(caught.value) and "offline" not in str(caught.value)
    assert list(cache.iterdir()) == [] and not (tmp_path / "out").exists()


def test_a_full_disk_while_writing_leaves_nothing_or_the_previous_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = write_archive(tmp_path / "src.tar", folder_entries(sample_images()))
    write_prepared(tmp_path / "previous", tiny_splits(), CIFAR10_CLASSES, {"run": "previous"})
    real_save = prepare._save_npz

    def save_then_fill_the_disk(path: Path, **arrays: np.ndarray) -> None:
        if path.name == "test.npz":  # the second file: train.npz is already written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real_save(path, **arrays)

    monkeypatch.setattr(prepare, "_save_npz", save_then_fill_the_disk)
    error = str(assert_fails_cleanly(tmp_path, str(archive), "Cannot write the prepared data to"))
    assert str(tmp_path / "previous") in error and "No space left on device" in error
    monkeypatch.setattr(prepare, "_save_npz", real_save)
    assert_retry_succeeds(tmp_path, str(archive))


def test_stale_partial_folders_of_killed_runs_are_removed(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    stale = tmp_path / f".out.partial-{dead.stdout.strip()}"
    stale.mkdir()
    (stale / "train.npz").write_bytes(b"half a file")
    running = tmp_path / f".out.partial-{os.getppid()}"  # a live process may still be writing this one
    running.mkdir()
    write_prepared(tmp_path / "out", tiny_splits(), CIFAR10_CLASSES, {})
    assert not stale.exists() and running.exists()
    assert load_split(tmp_path / "out", "train").images.shape == (20, 32, 32, 3)


def test_write_prepared_replaces_a_previous_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_prepared(out, tiny_splits(), CIFAR10_CLASSES, {"run": 1})
    manifest = write_prepared(out, tiny_splits(seed=1), CIFAR10_CLASSES, {"run": 2})
    assert manifest["run"] == 2 and json.loads((out / "manifest.json").read_text())["run"] == 2
    np.testing.assert_array_equal(load_split(out, "test").images, tiny_splits(seed=1)["test"][0])
    assert leftovers(tmp_path) == []


def test_write_prepared_rejects_malformed_arrays(tmp_path: Path) -> None:
    good = tiny_splits()
    floats = good["test"][0].astype(np.float32)
    with pytest.raises(ValueError, match="uint8"):
        write_prepared(tmp_path / "out", {**good, "test": (floats, good["test"][1])}, CIFAR10_CLASSES, {})
    with pytest.raises(ValueError, match="labels"):
        write_prepared(tmp_path / "out", {**good, "test": (good["test"][0], good["test"][1] + 10)}, CIFAR10_CLASSES, {})
    with pytest.raises(ValueError, match="splits"):
        write_prepared(tmp_path / "out", {"train": good["train"]}, CIFAR10_CLASSES, {})
    assert list(tmp_path.iterdir()) == []


def test_load_split_refuses_missing_or_incomplete_folders(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(DataError, match="no complete prepared data"):
        load_split(out, "train")
    write_prepared(out, tiny_splits(), CIFAR10_CLASSES, {})
    with pytest.raises(DataError, match="Unknown split 'val'"):
        load_split(out, "val")
    (out / "test.npz").write_bytes(b"junk")
    with pytest.raises(DataError, match="Cannot read"):
        load_split(out, "test")
    (out / "manifest.json").unlink()
    with pytest.raises(DataError, match=r"missing: manifest\.json"):
        load_split(out, "train")


# --- the real shared archive -------------------------------------------------------------------------------


@pytest.mark.e2e
def test_shared_archive_prepares_cifar10_as_the_quick_setting_asks(quick: Path) -> None:
    """The shared archive as the quick pipeline's download stage prepared it: all 50,000 training images read and
    the first 2,500 of each class kept (params.quick.yaml's train_size), every test image, class and checksum."""
    out = quick / "data" / "prepared" / "cifar10"
    manifest = json.loads((out / "manifest.json").read_text())
    train, test = load_split(out, "train"), load_split(out, "test")
    assert manifest["train_subset"] == {"train_size": 25_000, "archive_train_count": 50_000}
    assert train.images.shape == (25_000, 32, 32, 3) and test.images.shape == (10_000, 32, 32, 3)
    assert train.classes == test.classes == manifest["classes"] == CIFAR10_CLASSES
    assert np.bincount(train.labels).tolist() == [2_500] * 10
    assert np.bincount(test.labels).tolist() == [1_000] * 10
    assert manifest["splits"]["train"]["per_class"] == dict.fromkeys(CIFAR10_CLASSES, 2_500)
    assert manifest["splits"]["test"]["per_class"] == dict.fromkeys(CIFAR10_CLASSES, 1_000)
    assert manifest["archive"]["sha256"] == SHARED_SHA256
    means = train.images.mean(axis=(0, 1, 2)) / 255  # the whole split's: 0.4913, 0.4821, 0.4465
    np.testing.assert_allclose(means, [0.4919, 0.4823, 0.4463], atol=5e-4)

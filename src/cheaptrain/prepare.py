"""Download and prepare CIFAR-10/100 as uint8 arrays: the library behind the pipeline's `download` stage.

A source is "torchvision" (the official archives, md5-checked by torchvision), or a URL or local path of an
archive in one of two layouts, detected from its contents:

- the official python-format archive (cifar-10-python.tar.gz, cifar-100-python.tar.gz): pickled batches;
- an image folder: train/<class>/<image> and test/<class>/<image>, optionally under one top-level folder,
  as .tar, .tar.gz/.tgz or .zip (e.g. ../shared/datasets/cifar10-jpg.tar.gz, for machines that cannot reach
  the official download sites).

The output, out_dir/{train,test}.npz and out_dir/manifest.json, is written atomically by `write_prepared`.
"""

import errno
import hashlib
import http.client
import io
import json
import lzma
import os
import pickle
import re
import shutil
import socket
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, ClassVar

import numpy as np
from PIL import Image
from tqdm import tqdm

from cheaptrain.config import train_size_problem
from cheaptrain.data import IMAGE_SHAPE, SPLITS, DataError, describe_error

URL_PREFIXES = ("http://", "https://", "file://")
DOWNLOAD_TIMEOUT_S = 60
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a write that fails so names no file


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_classes: int
    torchvision_class: str  # class name in torchvision.datasets
    url: str  # official archive (torchvision's figures)
    filename: str
    md5: str
    folder: str  # top-level folder inside the official archive
    train_files: tuple[str, ...]  # pickled batches inside `folder`
    test_files: tuple[str, ...]
    meta_file: str
    label_key: str
    names_key: str
    example_source: str  # shown in error messages

    @property
    def official_members(self) -> list[str]:
        files = (*self.train_files, *self.test_files, self.meta_file)
        return [f"{self.folder}/{name}" for name in files]


DATASETS: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo(
        name="cifar10",
        num_classes=10,
        torchvision_class="CIFAR10",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        filename="cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        label_key="labels",
        names_key="label_names",
        example_source="../shared/datasets/cifar10-jpg.tar.gz",
    ),
    "cifar100": DatasetInfo(
        name="cifar100",
        num_classes=100,
        torchvision_class="CIFAR100",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        filename="cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        label_key="fine_labels",
        names_key="fine_label_names",
        example_source="../shared/datasets/cifar-100-python.tar.gz",
    ),
}

Splits = dict[str, tuple[np.ndarray, np.ndarray]]


def _info(dataset: str) -> DatasetInfo:
    if dataset not in DATASETS:
        raise DataError(f"Unknown dataset {dataset!r}: the accepted names are {', '.join(DATASETS)}.")
    return DATASETS[dataset]


def _env_var(dataset: str) -> str:
    return f"{dataset.upper()}_SOURCE"


def _local_hint(info: DatasetInfo) -> str:
    return (
        f"To use a local archive instead, set the param download.{info.name}.source or the environment "
        f"variable {_env_var(info.name)} to its path, e.g. {info.example_source} (a relative path is "
        "resolved against the repository root when DVC runs the stage, else against the current directory)."
    )


def resolve_source(dataset: str, source: str, environment: bool = True, root: Path | None = None) -> str:
    """The effective source: $<DATASET>_SOURCE over the param (unless `environment` is False); relative paths made
    absolute against `root` (default: the repository root under DVC, else the current directory)."""
    info = _info(dataset)
    source = (os.environ.get(_env_var(dataset), "").strip() if environment else "") or source.strip()
    if not source:
        raise DataError(
            f'No source given for {dataset}. Use "torchvision", a URL or an archive path. ' + _local_hint(info)
        )
    if source == "torchvision" or source.lower().startswith(URL_PREFIXES):
        return source
    # DVC runs stages in temporary copies of the repo: "../shared/..." must mean beside the real repo.
    base = root or Path(os.environ.get("DVC_ROOT") or os.getcwd())
    return str((base / Path(source).expanduser()).resolve())


def prepare_dataset(
    dataset: str,
    source: str,
    out_dir: Path,
    cache_dir: Path,
    sha256: str | None = None,
    progress: bool = True,
    train_size: int | None = None,
) -> dict:
    """Fetch, verify and decode `dataset` from `source`; write out_dir/{train,test}.npz + manifest.json.
    `train_size`: keep that many training images, the first of each class in the archive's order (the same number
    of each); None: all of them. The test split stays whole."""
    info = _info(dataset)
    if problem := train_size_problem(dataset, train_size):  # before any download
        raise DataError(problem)
    resolved = resolve_source(dataset, source)
    out_dir, cache_dir = Path(out_dir), Path(cache_dir)
    _check_writable(out_dir)  # before the download and the decoding, which take minutes
    # The sha256 is the param source's: another archive named by $<DATASET>_SOURCE is checked as one without it (an
    # official archive by its md5), and the manifest records its own.
    vouched = bool(source.strip()) and resolved == resolve_source(dataset, source, environment=False)
    expected = sha256.strip().lower() if sha256 and vouched else None
    if sha256 and sha256.strip() and not vouched:
        print(
            f"warning: {_env_var(dataset)} names the source {resolved}: the sha256 of params "
            f"(download.{dataset}.sha256) is not checked for that source",
            file=sys.stderr,
        )
    if resolved == "torchvision":
        splits, classes, archive = _from_torchvision(info, cache_dir, expected)
        layout = "torchvision"
    else:
        downloaded = resolved.lower().startswith(URL_PREFIXES)
        if downloaded:
            path = _download(info, resolved, cache_dir, expected, progress)
        else:
            path = _local_archive(info, resolved)
        try:
            sha, md5 = _digests(path)
            _check_sha256(path, sha, expected)
            archive = {"file": path.name, "sha256": sha, "md5": md5}
            splits, classes, layout = _read_archive(info, path, md5, expected, progress)
        except DataError as e:
            if not downloaded:
                raise
            path.unlink(missing_ok=True)  # a server that sent less than it said, or the wrong file: never cached
            raise DataError(f"What {resolved} sent is unusable (the download was deleted): {e}") from e
    if len(classes) != info.num_classes:
        raise DataError(
            f"{resolved} has {len(classes)} classes, but {info.name} has {info.num_classes}: "
            f"is it the right archive for {info.name}? {_local_hint(info)}"
        )
    env = os.environ.get(_env_var(dataset), "").strip() or None
    extra = {
        "dataset": dataset,
        "source": {"param": source, "env": env},
        "layout": layout,
        "archive": archive,
    }
    if train_size is not None:  # the manifest of every image stays as it was: DVC then sees the same data
        extra["train_subset"] = {"train_size": train_size, "archive_train_count": len(splits["train"][1])}
        splits = splits | {"train": _first_of_each_class(*splits["train"], train_size // info.num_classes, info)}
    return write_prepared(out_dir, splits, classes, extra)


def _first_of_each_class(
    images: np.ndarray, labels: np.ndarray, per_class: int, info: DatasetInfo
) -> tuple[np.ndarray, np.ndarray]:
    """The first `per_class` images of each class, in their order in the split."""
    where = [np.flatnonzero(labels == c) for c in range(info.num_classes)]
    if (fewest := min(map(len, where))) < per_class:
        raise DataError(
            f"download.{info.name}.train_size: {per_class * info.num_classes} asks for {per_class} images of each "
            f"class, but the archive's training split has {fewest} of its smallest class; at most "
            f"{fewest * info.num_classes}"
        )
    keep = np.sort(np.concatenate([w[:per_class] for w in where]))
    return images[keep], labels[keep]


# --- sources ---------------------------------------------------------------------------------------------


def _from_torchvision(info: DatasetInfo, cache_dir: Path, expected: str | None) -> tuple[Splits, list[str], dict]:
    from torchvision import datasets  # slow import, needed by this source only

    _make_cache(cache_dir)
    dataset_class = getattr(datasets, info.torchvision_class)
    previous_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)  # torchvision's urlopen has no timeout of its own
    try:
        loaded = {split: dataset_class(root=str(cache_dir), train=split == "train", download=True) for split in SPLITS}
    except Exception as e:  # URLError, timeouts, torchvision's RuntimeError on a failed md5 check, ...
        raise DataError(
            f"torchvision could not download or verify the official {info.filename} from {info.url} into "
            f"{cache_dir} ({describe_error(e)}). The machine may be offline or the site unreachable. "
            + _local_hint(info)
        ) from e
    finally:
        socket.setdefaulttimeout(previous_timeout)
    splits = {
        split: (np.ascontiguousarray(ds.data, dtype=np.uint8), np.asarray(ds.targets, dtype=np.int64))
        for split, ds in loaded.items()
    }
    # torchvision keeps the archive it verified; record its sha256 as for any other source.
    tar = cache_dir / info.filename
    sha = _digests(tar)[0] if tar.is_file() else None
    if expected and sha is None:
        raise DataError(
            f"Cannot check the expected sha256: {tar} is missing (torchvision reused extracted "
            "files). Delete the cache folder and run again."
        )
    _check_sha256(tar, sha, expected)
    archive = {"file": info.filename, "url": info.url, "md5": info.md5, "sha256": sha}
    return splits, list(loaded["train"].classes), archive


def _local_archive(info: DatasetInfo, resolved: str) -> Path:
    path = Path(resolved)
    if not path.exists():
        raise DataError(f"The source archive {path} does not exist. {_local_hint(info)}")
    if not path.is_file():
        raise DataError(
            f"The source {path} is not a file: expected a .tar, .tar.gz/.tgz or .zip archive. " + _local_hint(info)
        )
    return path


def _download(info: DatasetInfo, url: str, cache_dir: Path, expected: str | None, progress: bool) -> Path:
    """Download into cache_dir under a temporary name, renamed when complete; reuse a copy that verifies."""
    parsed = urllib.parse.urlparse(url)
    _make_cache(cache_dir)
    dest = cache_dir / (PurePosixPath(parsed.path).name or f"{info.name}-source")
    # Without an expected checksum a cached copy cannot be trusted to be the same data: download again.
    if dest.is_file() and (expected or dest.name == info.filename):
        sha, md5 = _digests(dest)
        if sha == expected or (not expected and md5 == info.md5):
            return dest
    if parsed.scheme.lower() == "file" and not Path(urllib.request.url2pathname(parsed.path)).is_file():
        raise DataError(f"The source {url} names no existing file. {_local_hint(info)}")
    _remove_stale(cache_dir / dest.name, "download")
    tmp = cache_dir / f".{dest.name}.download-{os.getpid()}"
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, tmp.open("wb") as f:
            if (response.headers.get("Content-Type") or "").startswith("text/html"):
                raise DataError(
                    f"{url} is a web page (text/html), not an archive: the link leads to a download page, not to "
                    f"the file itself. Give the direct link to the archive. {_local_hint(info)}"
                )
            size = int(response.headers.get("Content-Length") or 0)
            with tqdm(
                total=size or None,
                unit="B",
                unit_scale=True,
                desc=f"downloading {dest.name}",
                disable=None if progress else True,
            ) as bar:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
        received = tmp.stat().st_size
        if size and received != size:
            raise DataError(
                f"The download of {url} stopped after {received} of {size} bytes. Run again to "
                f"retry; if it keeps failing, download it by hand. {_local_hint(info)}"
            )
        tmp.replace(dest)
    except (OSError, http.client.HTTPException, ValueError) as e:
        if isinstance(e, OSError) and (e.filename == str(tmp) or e.errno in FULL_DISK):  # the cache, not the network
            raise DataError(
                f"Cannot write the download of {url} into {cache_dir} ({describe_error(e)}): give a folder that can "
                "be written and has free space (the stage's --cache)."
            ) from e
        raise DataError(
            f"Could not download {url} ({describe_error(e)}). The machine may be offline, or "
            f"the URL is wrong. {_local_hint(info)}"
        ) from e
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _make_cache(cache_dir: Path) -> None:
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on its path, a read-only disk
        raise DataError(
            f"Cannot use {cache_dir} as the download cache ({describe_error(e)}): give a folder that can be "
            "written (the stage's --cache)."
        ) from e


def _digests(path: Path) -> tuple[str, str]:
    """(sha256, md5) of a file in one pass."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), md5.hexdigest()


def _check_sha256(path: Path, actual: str | None, expected: str | None) -> None:
    if expected and actual != expected:
        raise DataError(
            f"Checksum mismatch for {path}: its sha256 is {actual}, expected {expected}. The "
            "file is truncated, corrupt or a different archive: replace it (a cached download is "
            "fetched again on the next run), or update the expected sha256 if this archive is "
            "intended."
        )


# --- archives ----------------------------------------------------------------------------------------------


def _read_archive(
    info: DatasetInfo, path: Path, md5: str, expected: str | None, progress: bool
) -> tuple[Splits, list[str], str]:
    files = _archive_files(path, progress)
    official = next((i for i in DATASETS.values() if all(m in files for m in i.official_members)), None)
    if official is None:
        splits, classes = _decode_image_folder(info, path, files, progress)
        return splits, classes, "image-folder"
    if official is not info:
        raise DataError(
            f"{path} is the official {official.name} archive, but the dataset is {info.name}. " + _local_hint(info)
        )
    # With an explicit sha256 the caller vouches for the archive (already checked); otherwise it must be
    # the official one, checked before any pickle in it is loaded.
    if not expected and md5 != info.md5:
        raise DataError(
            f"Checksum mismatch for {path}: its md5 is {md5}, but the official {info.filename} "
            f"has {info.md5}. The file is truncated, corrupt or modified: replace it, or pass "
            "the archive's sha256 explicitly to accept a modified archive."
        )
    splits, classes = _parse_official(info, path, files)
    return splits, classes, "official-python"


def _archive_files(path: Path, progress: bool) -> dict[str, bytes]:
    """Every regular file of a tar or zip archive by normalised member name, read in one sequential pass."""
    bar = {"desc": f"reading {path.name}", "unit": " files", "disable": None if progress else True}
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as zf:
                return {
                    PurePosixPath(m.filename).as_posix(): zf.read(m)
                    for m in tqdm(zf.infolist(), **bar)
                    if not m.is_dir()
                }
        with tarfile.open(path, "r:*") as tf:
            files = {PurePosixPath(m.name).as_posix(): tf.extractfile(m).read() for m in tqdm(tf, **bar) if m.isfile()}
            _read_to_the_end(path, tf.fileobj)
            return files
    # RuntimeError: encrypted zip; NotImplementedError: unsupported zip compression.
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        OSError,
        RuntimeError,
        NotImplementedError,
    ) as e:
        raise DataError(
            f"Cannot read {path} as a tar or zip archive ({describe_error(e)}): it is not an "
            "archive, or it is truncated or corrupt. Replace it with a complete copy and run "
            "again."
        ) from e


def _read_to_the_end(path: Path, stream: IO[bytes]) -> None:
    """Read a tar's (decompressed) stream to its end: tarfile stops at the end-of-archive marker, before gzip's trailer,
    so only reading on checks its CRC and length, the one check of an image folder without a sha256. What is left
    is the tar's padding: a few KiB."""
    try:
        while stream.read(1 << 20):
            pass
    except (EOFError, zlib.error, lzma.LZMAError, OSError) as e:  # gzip's BadGzipFile is an OSError
        raise DataError(
            f"{path} is corrupt: its compressed stream fails its checksum or ends early ({describe_error(e)}); "
            "fetch it again, or replace it with a good copy."
        ) from e


def _decode_image_folder(
    info: DatasetInfo, path: Path, files: dict[str, bytes], progress: bool
) -> tuple[Splits, list[str]]:
    # root ("" or one top-level folder) -> split -> class -> member names
    tree: dict[str, dict[str, dict[str, list[str]]]] = {}
    for name in files:
        parts = PurePosixPath(name).parts
        if parts[-1].startswith("."):  # .DS_Store, macOS "._" resource forks
            continue
        if len(parts) == 3 and parts[0] in SPLITS:
            root, (split, label, _) = "", parts
        elif len(parts) == 4 and parts[1] in SPLITS:
            root, (split, label, _) = parts[0], parts[1:]
        else:
            continue
        tree.setdefault(root, {}).setdefault(split, {}).setdefault(label, []).append(name)

    expected_layout = (
        f"Expected either the official python-format archive ({info.filename}) or an "
        "image folder: train/<class>/<image> and test/<class>/<image>, optionally under one "
        "top-level folder."
    )
    if not tree:
        top = sorted({PurePosixPath(n).parts[0] for n in files})[:10]
        raise DataError(
            f"{path} has neither known layout (top-level entries: {', '.join(top) or 'none'}). " + expected_layout
        )
    if len(tree) > 1:
        raise DataError(
            f"{path} has train/test folders under several top-level folders "
            f"({', '.join(sorted(tree))}); it must have one. " + expected_layout
        )
    root, splits = next(iter(tree.items()))
    where = f"{path} (under {root}/)" if root else str(path)
    for split in SPLITS:
        if split not in splits:
            raise DataError(f"{where} has no {split}/ folder of images. " + expected_layout)
    train_classes, test_classes = set(splits["train"]), set(splits["test"])
    if train_classes != test_classes:
        raise DataError(
            f"{where} has different class folders in train/ and test/: only in train/: "
            f"{sorted(train_classes - test_classes) or 'none'}; only in test/: "
            f"{sorted(test_classes - train_classes) or 'none'}. Every class needs a folder in "
            "both."
        )
    classes = sorted(train_classes)
    if len(classes) != info.num_classes:
        raise DataError(
            f"{where} has {len(classes)} class folders, but {info.name} has {info.num_classes}: "
            "a class folder is missing, or this is an archive of another dataset."
        )
    for split in SPLITS:
        _check_balanced(where, split, {cls: len(splits[split][cls]) for cls in classes})

    out: Splits = {}
    total = sum(len(names) for split in splits.values() for names in split.values())
    with tqdm(total=total, desc=f"decoding {path.name}", unit=" images", disable=None if progress else True) as bar:
        for split in SPLITS:
            # Sorted class folders and file names, so the result never depends on the archive's order.
            members = [(name, label) for label, cls in enumerate(classes) for name in sorted(splits[split][cls])]
            images = np.empty((len(members), *IMAGE_SHAPE), dtype=np.uint8)
            for i, (name, _) in enumerate(members):
                images[i] = _decode_image(path, name, files[name])
                bar.update()
            out[split] = (images, np.array([label for _, label in members], dtype=np.int64))
    return out, classes


def _check_balanced(where: str, split: str, counts: dict[str, int]) -> None:
    """CIFAR's splits hold as many images of each class: a tar cut at a member boundary reads without an error, but
    with fewer images in its last class."""
    usual = Counter(counts.values()).most_common(1)[0][0]
    kind = "training" if split == "train" else "test"
    odd = [f"class {cls} has {n} {kind} images" for cls, n in counts.items() if n != usual]
    if odd:
        raise DataError(
            f"{where}: the archive is incomplete or not CIFAR's: {', '.join(odd)}, the others {usual}. Replace it "
            "with a complete copy of a CIFAR archive."
        )


def _decode_image(path: Path, name: str, data: bytes) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(data)) as image:
            size, mode = image.size, image.mode
            if size == IMAGE_SHAPE[:2] and mode == "RGB":
                image.load()
                return np.asarray(image)
    except Exception as e:  # PIL raises many types on corrupt data (OSError, SyntaxError, struct.error, ...)
        raise DataError(
            f"{path}: cannot decode the image {name} ({describe_error(e)}). The archive is "
            "corrupt: replace it with a good copy."
        ) from e
    raise DataError(
        f"{path}: the image {name} is {size[0]}x{size[1]} {mode}, but CIFAR images are 32x32 "
        "RGB. Fix or remove it, or use an archive of the original images."
    )


class _BatchUnpickler(pickle.Unpickler):
    """Loads only what CIFAR batches hold (dicts, lists, numpy arrays): an archive cannot run code."""

    ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy.core.multiarray", "_reconstruct"),  # pickles written with numpy 1.x, as the official ones
        ("numpy._core.multiarray", "_reconstruct"),  # and with numpy 2.x
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # bytes in protocol-2 pickles written by Python 3
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name}")
        return super().find_class(module, name)


def _unpickle(data: bytes) -> dict:
    # latin1: the official batches were pickled by Python 2 (str keys, raw array bytes).
    return _BatchUnpickler(io.BytesIO(data), encoding="latin1").load()


def _parse_official(info: DatasetInfo, path: Path, files: dict[str, bytes]) -> tuple[Splits, list[str]]:
    out: Splits = {}
    try:
        classes = [str(c) for c in _unpickle(files[f"{info.folder}/{info.meta_file}"])[info.names_key]]
        for split, names in (("train", info.train_files), ("test", info.test_files)):
            batches = [_unpickle(files[f"{info.folder}/{name}"]) for name in names]
            data = np.concatenate([np.asarray(b["data"], dtype=np.uint8) for b in batches])
            labels = np.concatenate([np.asarray(b[info.label_key], dtype=np.int64) for b in batches])
            if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
                raise ValueError(f"{split}: data {data.shape}, {len(labels)} labels; expected [N, 3072], N")
            if len(labels) and not 0 <= labels.min() <= labels.max() < len(classes):
                raise ValueError(f"{split}: labels outside 0..{len(classes) - 1}")
            # Rows are the R, G and B planes (CHW); the prepared arrays are HWC.
            out[split] = (np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)), labels)
    except (pickle.UnpicklingError, EOFError, KeyError, IndexError, TypeError, ValueError) as e:
        raise DataError(
            f"{path} looks like the official {info.filename}, but its contents are unexpected "
            f"({describe_error(e)}). Replace it with the official archive."
        ) from e
    return out, classes


# --- prepared data -----------------------------------------------------------------------------------------


def write_prepared(
    out_dir: Path, splits: dict[str, tuple[np.ndarray, np.ndarray]], classes: list[str], manifest_extra: dict
) -> dict:
    """Write {train,test}.npz and manifest.json into out_dir atomically; return the manifest.

    Everything is built in a sibling temporary folder that replaces out_dir by renames only when complete,
    so out_dir is either absent, the previous complete data or the new complete data, also when writing fails (a
    DataError: a full disk, a file in the way).
    """
    out_dir = Path(out_dir)
    classes = [str(c) for c in classes]
    if set(splits) != set(SPLITS):
        raise ValueError(f"splits must be exactly {SPLITS}, got {sorted(splits)}")
    arrays = {}
    for split in SPLITS:
        images, labels = np.asarray(splits[split][0]), np.asarray(splits[split][1])
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != IMAGE_SHAPE:
            raise ValueError(f"{split} images: {images.dtype} {images.shape}, expected uint8 [N, 32, 32, 3]")
        if labels.shape != (len(images),) or labels.dtype.kind not in "iu":
            raise ValueError(f"{split} labels: {labels.dtype} {labels.shape}, expected {len(images)} ints")
        if len(labels) and not 0 <= labels.min() <= labels.max() < len(classes):
            raise ValueError(f"{split} labels must lie in 0..{len(classes) - 1}")
        arrays[split] = (np.ascontiguousarray(images), labels.astype(np.int64))

    manifest = {
        **manifest_extra,
        "classes": classes,
        "splits": {
            split: {"count": len(labels), "per_class": _per_class(labels, classes)}
            for split, (_, labels) in arrays.items()
        },
    }  # content only (no times, no absolute paths): identical data gives an identical manifest

    try:
        _write_folder(out_dir, arrays, classes, manifest)
    except OSError as e:  # a file where a folder must be, a read-only or full disk
        raise _unwritable(out_dir, e) from e
    return manifest


def _check_writable(out_dir: Path) -> None:
    """DataError unless out_dir's folder can be made and written: its nearest existing folder is a folder that can be
    written. Creates nothing."""
    folder = out_dir.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        problem = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))
    else:
        return
    raise _unwritable(out_dir, problem)


def _unwritable(out_dir: Path, error: OSError) -> DataError:
    return DataError(
        f"Cannot write the prepared data to {out_dir} ({describe_error(error)}): give a folder that can be written "
        "and has free space (the stage's --out)."
    )


def _write_folder(
    out_dir: Path, arrays: dict[str, tuple[np.ndarray, np.ndarray]], classes: list[str], manifest: dict
) -> None:
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out_dir)
    partial = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    _remove(partial)
    try:
        partial.mkdir()
        for split, (images, labels) in arrays.items():
            _save_npz(partial / f"{split}.npz", images=images, labels=labels, classes=np.array(classes))
        (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        _swap(partial, out_dir)
    except BaseException:  # including KeyboardInterrupt: never leave a partial folder behind
        _remove(partial)
        raise


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """np.savez, minus the current time that it stamps into the zip: the same data gives the same bytes, so
    DVC sees an unchanged output and does not retrain anything after a re-run of the download stage."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            entry = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(entry, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)


def _per_class(labels: np.ndarray, classes: list[str]) -> dict[str, int]:
    counts = np.bincount(labels, minlength=len(classes)).tolist()
    return dict(zip(classes, counts, strict=True))


def _swap(partial: Path, out_dir: Path) -> None:
    """Replace out_dir by partial with renames (a non-empty folder cannot be renamed over another)."""
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    _remove(old)
    if out_dir.exists() or out_dir.is_symlink():
        out_dir.rename(old)
    try:
        partial.rename(out_dir)
    except BaseException:
        if old.exists() or old.is_symlink():
            old.rename(out_dir)  # put the previous complete data back
        raise
    _remove(old)


def _remove_stale(target: Path, kinds: str = "partial|old") -> None:
    """Remove the temporary files or folders (.<name>.<kind>-<pid>) of earlier runs that were killed before they
    could clean up: a killed download would otherwise leave a partial archive in the cache for ever."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.({kinds})-(\d+)")
    for path in target.parent.iterdir():
        match = pattern.fullmatch(path.name)
        if match and not _alive(int(match[2])):
            _remove(path)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover: nothing of this process is writing it now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)

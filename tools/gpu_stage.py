"""Prepares, on a machine with network, what tools/gpu_check.py needs on a GPU machine without one, in the
git-ignored .gpu/ of the checkout, and prints the calls that carry it there (at most 64 MiB each, the
working tree included).

    python tools/gpu_stage.py [--lidar-ai-solution GIT_DIR] [--data DIR] [--ort-include DIR] [--cuda-arch 90]

What it writes under .gpu/:
  ort/        onnxruntime's C/C++ API headers (the CUDA build compiles against them)
  data/       the real frames, and NVIDIA's exptool file of CenterPoint's backbone with spconv's outputs of it
  whl/        onnx-graphsurgeon, which the GPU machine's Python lacks
  ort-gpu/    onnxruntime-gpu (CUDA 13): its Python package less the TensorRT provider and the C API library
              (nothing here loads them), with the CUDA provider's kernels kept for one GPU architecture
              (--cuda-arch, the H100's and H200's 90), xz-compressed and split into parts of at most
              48 MiB, with their SHA256SUMS; tools/gpu_check.py --ort-gpu reassembles them there
  libspconv/  NVIDIA's closed libspconv 1.1.10 from a clone of NVIDIA-AI-IOT/Lidar_AI_Solution (commit
              9a2c840; later commits hold only Git LFS pointers): include/spconv/*.hpp, lib/libspconv.so
              (built for CUDA 12.6) and lib/libcudart.so.12 (from the nvidia-cuda-runtime-cu12 wheel),
              for tools/gpu_check.py --libspconv; skipped without --lidar-ai-solution
  download/   the downloaded wheels (never carried)

None of these files is ever committed: .gpu/ is git-ignored, and third-party files stay there.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # what one call to the GPU machine carries, the working tree included
PART_SIZE = 48 * MIB
ORT_GPU = "onnxruntime-gpu==1.31.1"
GRAPHSURGEON = "onnx-graphsurgeon==0.6.1"
CUDART_12 = "nvidia-cuda-runtime-cu12==12.6.77"
# The GPU machine's Python (python3 there), and the platforms of the wheels it installs.
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# Not carried: nothing here loads them, and they are a tenth of the package.
ORT_GPU_LEFT_OUT = ("onnxruntime/capi/libonnxruntime_providers_tensorrt.so", "onnxruntime/capi/libonnxruntime.so.")
CUDA_PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
LIBSPCONV_COMMIT = "9a2c840"  # "add spconv-v1.1.10 with SM90", the last whose libraries are stored in Git itself
LIBSPCONV_PATH = "libraries/3DSparseConvolution/libspconv"
LIBSPCONV_BUILD = "x86_64_cuda12.6"
FATBIN_MAGIC = 0xBA55ED50
FATBIN_ELF = 2  # an entry of machine code (1 is PTX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu",
                        help="where to write (default: the checkout's .gpu/)")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="the shared data: the real frames and wild/nvidia_exptool/")
    parser.add_argument("--ort-include", type=Path, default=default_headers(),
                        help="onnxruntime's C/C++ API headers (default: $ORT_INCLUDE_DIR, else the build's cache)")
    parser.add_argument("--lidar-ai-solution", type=Path, metavar="GIT_DIR",
                        help="a clone (or bare Git folder) of NVIDIA-AI-IOT/Lidar_AI_Solution holding commit "
                             f"{LIBSPCONV_COMMIT}: libspconv is staged from it")
    parser.add_argument("--cuda-arch", type=int, default=90,
                        help="the compute capability (major × 10 + minor) whose CUDA kernels onnxruntime-gpu keeps")
    args = parser.parse_args()
    out = args.out
    copy_folder(args.ort_include, out / "ort")
    stage_data(args.data, out / "data")
    pip_download(GRAPHSURGEON, out / "whl")
    stage_ort_gpu(out, args.cuda_arch)
    if args.lidar_ai_solution:
        stage_libspconv(args.lidar_ai_solution, out)
    else:
        print("libspconv: not staged (no --lidar-ai-solution); gpu_check.py runs without its anchor")
    print_plan(out)


def default_headers() -> Path:
    """The headers CMake fetched for the CPU build (custom_ops/cmake/OrtHeaders.cmake), unless $ORT_INCLUDE_DIR
    names others."""
    if os.environ.get("ORT_INCLUDE_DIR"):
        return Path(os.environ["ORT_INCLUDE_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "sparse_lower" / "onnxruntime-1.21-headers"


def copy_folder(source: Path, target: Path) -> None:
    if not source.is_dir():
        sys.exit(f"no folder {source}")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)


def stage_data(data: Path, target: Path) -> None:
    """The frames and the exptool file with its expected outputs, in the layout of the shared data."""
    names = ["nuscenes_centerpoint_voxels.npz", "nuscenes_bevfusion_voxels.npz",
             "wild/nvidia_exptool/centerpoint.scn.onnx", "wild/nvidia_exptool/centerpoint.scn.expected.npz"]
    for name in names:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(data / name, target / name)


def pip_download(requirement: str, folder: Path) -> Path:
    """The wheel of `requirement` for the GPU machine's Python, without its dependencies (that machine has
    them, or they are named one by one), moved into `folder`; its path."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as temporary:  # exactly the one wheel pip chose, whatever `folder` holds
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms, "-d", temporary,
                        requirement], check=True)
        (wheel,) = Path(temporary).glob("*.whl")
        folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.move(wheel, folder / wheel.name))


def stage_ort_gpu(out: Path, arch: int) -> None:
    """onnxruntime-gpu as the parts of out/ort-gpu/ (those of an earlier staging removed)."""
    wheel = pip_download(ORT_GPU, out / "download")
    archive = ort_gpu_archive(wheel, arch)
    parts = out / "ort-gpu"
    shutil.rmtree(parts, ignore_errors=True)
    split(archive, parts)
    print(f"onnxruntime-gpu: {wheel.name} ({wheel.stat().st_size / MIB:.1f} MiB) → {len(archive) / MIB:.1f} MiB "
          f"in {len(list(parts.glob('part.*')))} parts (kernels for sm_{arch} alone)")


def ort_gpu_archive(wheel: Path, arch: int) -> bytes:
    """The wheel's Python package and metadata as a .tar.xz, less ORT_GPU_LEFT_OUT, the CUDA provider's
    kernels for `arch` alone (keep_kernels)."""
    archive = io.BytesIO()
    with zipfile.ZipFile(wheel) as files, lzma.open(archive, "wb", preset=9) as packed, \
            tarfile.open(fileobj=packed, mode="w|") as tar:
        for member in files.infolist():
            if member.is_dir() or member.filename.startswith(ORT_GPU_LEFT_OUT):
                continue
            content = files.read(member)
            if member.filename == CUDA_PROVIDER:
                content = keep_kernels(content, arch)
            info = tarfile.TarInfo(member.filename)
            info.size, info.mode = len(content), 0o755 if ".so" in member.filename else 0o644
            tar.addfile(info, io.BytesIO(content))
    return archive.getvalue()


def keep_kernels(library: bytes, arch: int) -> bytes:
    """A copy of a CUDA shared library whose machine code for any GPU other than compute capability
    `arch` is zeroed, everything else (the entries' headers, PTX) untouched. The driver picks the entry
    for its own GPU out of each fatbin and never reads the others, so the library runs as before on
    that GPU; the zeroed code compresses to nothing: onnxruntime-gpu's CUDA provider, 218 MB of
    kernels for six architectures, travels in a third of the size."""
    data = bytearray(library)
    for kind, entry_arch, start, size in fatbin_entries(library):
        if kind == FATBIN_ELF and entry_arch != arch:
            data[start:start + size] = bytes(size)
    return bytes(data)


def fatbin_entries(library: bytes) -> Iterator[tuple[int, int, int, int]]:
    """(kind, architecture, offset, size) of the code of each entry of the fatbins in a CUDA shared library's
    .nv_fatbin section. A fatbin is a header (u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size
    of its entries) and entries, each a header (u16 kind, u16 version, u32 header size, u64 size of the
    code; the architecture a u32 at byte 28) and the code."""
    start, size = elf_section(library, ".nv_fatbin")
    position, end = start, start + size
    while position < end:
        magic, _, header, entries = struct.unpack_from("<IHHQ", library, position)
        if magic != FATBIN_MAGIC:  # padding between fatbins
            position += 8
            continue
        entry, last = position + header, position + header + entries
        while entry < last:
            kind, _, entry_header, code = struct.unpack_from("<HHIQ", library, entry)
            if entry_header == 0:
                raise ValueError(f"a fatbin entry of no size at byte {entry}: not a fatbin this reader knows")
            (entry_arch,) = struct.unpack_from("<I", library, entry + 28)
            yield kind, entry_arch, entry + entry_header, code
            entry += entry_header + code
        position = last


def elf_section(library: bytes, name: str) -> tuple[int, int]:
    """(file offset, size) of the section `name` of a 64-bit little-endian ELF file."""
    section_headers, = struct.unpack_from("<Q", library, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", library, 0x3A)

    def header(index: int) -> tuple[int, int, int]:
        fields = struct.unpack_from("<IIQQQQ", library, section_headers + index * entry_size)
        return fields[0], fields[4], fields[5]  # name offset, file offset, size
    _, names, _ = header(names_index)
    for index in range(count):
        offset, start, size = header(index)
        if library[names + offset:library.index(b"\0", names + offset)].decode() == name:
            return start, size
    raise ValueError(f"no section {name} in the library")


def split(archive: bytes, folder: Path, part_size: int = PART_SIZE) -> None:
    """`archive` as part.00, part.01, … of at most `part_size` bytes in `folder`, with their SHA256SUMS
    (sha256sum's format: gpu_check.py checks every part and that none is missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    sums = []
    for index, start in enumerate(range(0, len(archive), part_size)):
        part = archive[start:start + part_size]
        (folder / f"part.{index:02d}").write_bytes(part)
        sums.append(f"{hashlib.sha256(part).hexdigest()}  part.{index:02d}\n")
    (folder / "SHA256SUMS").write_text("".join(sums))


def stage_libspconv(git_dir: Path, out: Path) -> None:
    """libspconv's public headers and CUDA 12.6 library from `git_dir` at LIBSPCONV_COMMIT, and the CUDA 12
    runtime it links to (the GPU machine has CUDA 13's alone)."""
    target = out / "libspconv"
    shutil.rmtree(target, ignore_errors=True)
    (target / "include" / "spconv").mkdir(parents=True)
    (target / "lib").mkdir()
    headers = git(git_dir, "ls-tree", "--name-only", LIBSPCONV_COMMIT, f"{LIBSPCONV_PATH}/include/spconv/").split()
    for header in map(bytes.decode, headers):
        content = git(git_dir, "show", f"{LIBSPCONV_COMMIT}:{header}")
        (target / "include" / "spconv" / Path(header).name).write_bytes(content)
    library = git(git_dir, "show", f"{LIBSPCONV_COMMIT}:{LIBSPCONV_PATH}/lib/{LIBSPCONV_BUILD}/libspconv.so")
    if not library.startswith(b"\x7fELF"):
        sys.exit(f"{git_dir} holds no libspconv.so at {LIBSPCONV_COMMIT} (a Git LFS pointer?)")
    (target / "lib" / "libspconv.so").write_bytes(library)
    with zipfile.ZipFile(pip_download(CUDART_12, out / "download")) as wheel:
        (target / "lib" / "libcudart.so.12").write_bytes(wheel.read("nvidia/cuda_runtime/lib/libcudart.so.12"))
    print(f"libspconv: {len(headers)} headers, libspconv.so ({len(library) / MIB:.1f} MiB), libcudart.so.12")


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True, capture_output=True).stdout


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def working_tree_size() -> int:
    """What every call carries besides its carry list: the tracked files and the untracked ones git does not ignore."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    return sum((ROOT / name).stat().st_size for name in listed if name and (ROOT / name).is_file())


def calls(out: Path) -> list[list[Path]]:
    """The carry lists of the calls: one for each onnxruntime-gpu part but the last, then the last part
    with everything else (in a call of its own too where they do not fit together)."""
    parts = sorted((out / "ort-gpu").glob("part.*"))
    rest = [out / name for name in ("ort", "data", "whl", "libspconv") if (out / name).exists()]
    last = rest + [parts[-1], out / "ort-gpu" / "SHA256SUMS"]
    if sum(map(size, last)) + working_tree_size() <= CALL_LIMIT:
        return [[part] for part in parts[:-1]] + [last]
    return [[part] for part in parts] + [rest + [out / "ort-gpu" / "SHA256SUMS"]]


def print_plan(out: Path) -> None:
    """The calls to make, in order, one right after the other: the parts wait in /tmp of the machine, which
    stays warm for 30 s after a call."""
    tree = working_tree_size()
    plan = calls(out)
    print(f"\nThe GPU machine's calls, one right after the other (the working tree is {tree / MIB:.1f} MiB; each "
          f"call at most {CALL_LIMIT // MIB} MiB):")
    for number, carry in enumerate(plan, 1):
        total = tree + sum(map(size, carry))
        command = "bash tools/gpu_run.sh" + ("" if number == len(plan) else " --keep")
        listed = ", ".join(f'"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"' for path in carry)
        print(f"  {number}. carry [{listed}] ({total / MIB:.1f} MiB{', TOO LARGE' if total > CALL_LIMIT else ''}); "
              f"command: {command}")


if __name__ == "__main__":
    main()

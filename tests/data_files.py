"""Where the real data the tests read lives: ``tests/data/``, shipped with the repository.

Why a module: a measurement tool's most telling tests run on real captures, so a fresh clone
must run them too. A missing file is a failure (``data_file`` raises), never a skip.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
PUBLIC = DATA / "public"
H100_CAPTURE = DATA / "h100_nvml_seed11.npz"
LAYERS_CAPTURE = DATA / "layers"  # vgg16b64_*: a profiled VGG16 step and its NVML samples
LAYERS_RECORD = DATA / "layers_record"  # layer records as the dict-built study wrote them
ZEUS_TRACE = PUBLIC / "zeus/examples/research_reproducibility/zeus_nsdi23/trace"
ZEUS_PROFILE = PUBLIC / "zeus/tests/profile_data"
KT_A100 = (PUBLIC / "kernel_tuner_tutorial/energy/data"
           / "synthetic_fp32_cache_NVIDIA_A100-PCIE-40GB.json")
PS3_TUNING = (PUBLIC / "powersensor3-results/GPU-tuning"
              / "AD4000_wmma_complex_gemm_opt_16bit_1x4096x4096x4096.json")
PMT_LOG = PUBLIC / "powersensor3-results/PMT/ad4000/pmt-nvml.log"
ULISBOA = PUBLIC / "hpc-ulisboa-gpupowermodel"


def data_file(relpath: str) -> Path:
    """A file under tests/data, or a FileNotFoundError saying the checkout is incomplete."""
    path = DATA / relpath
    if not path.exists():
        raise FileNotFoundError(f"{path}: test data missing from the repository checkout")
    return path

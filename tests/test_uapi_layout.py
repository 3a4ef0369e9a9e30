"""The Python view of the UAPI matches the C header: the structs the compiler laid out in
pagetier.ko (its DWARF), and the ioctl numbers, sizes and constants a compiled probe prints."""
import shutil
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from pagetier import uapi

REPO = Path(__file__).resolve().parent.parent
BUILT = sorted((REPO / "build" / "kmod").glob("*/pagetier.ko"))


def dwarf_structs(ko: Path) -> dict[str, tuple[int, dict[str, int]]]:
    """{struct name: (size, {member: offset})} for the pagetier_* structs in ko's DWARF."""
    found = {}
    with open(ko, "rb") as f:
        elf = ELFFile(f)
        if not elf.has_dwarf_info():
            pytest.skip(f"{ko} has no DWARF")
        for cu in elf.get_dwarf_info().iter_CUs():
            for die in cu.iter_DIEs():
                if die.tag != "DW_TAG_structure_type" or "DW_AT_name" not in die.attributes:
                    continue
                name = die.attributes["DW_AT_name"].value.decode()
                if name in uapi.STRUCTS and "DW_AT_byte_size" in die.attributes:
                    members = {
                        m.attributes["DW_AT_name"].value.decode():
                            m.attributes["DW_AT_data_member_location"].value
                        for m in die.iter_children() if m.tag == "DW_TAG_member"
                    }
                    found[name] = (die.attributes["DW_AT_byte_size"].value, members)
    return found


@pytest.mark.skipif(not BUILT, reason="pagetier.ko not built (scripts/setup.sh builds it)")
@pytest.mark.parametrize("ko", BUILT, ids=[p.parent.name for p in BUILT])
def test_struct_layout_matches_module(ko):
    structs = dwarf_structs(ko)
    # every struct that crosses the boundary is in the module's debug info
    assert set(structs) == set(uapi.STRUCTS)
    for name, dtype in uapi.STRUCTS.items():
        size, members = structs[name]
        assert size == dtype.itemsize, name
        assert members == {f: dtype.fields[f][1] for f in dtype.names}, name


def test_ioctl_numbers_are_distinct_and_sized():
    cmds = [uapi.IOC_VERSION, uapi.IOC_ATTACH, uapi.IOC_DETACH, uapi.IOC_READ, uapi.IOC_STATS,
            uapi.IOC_UNMARK, uapi.IOC_READ_REGIONS, uapi.IOC_READ_PAGES]
    assert len(set(cmds)) == len(cmds)
    assert (uapi.IOC_READ >> 16) & 0x3FFF == uapi.READ_T.itemsize


# what the C compiler makes of the header: each ioctl number, struct size and constant, printed by
# a probe compiled against kmod/include/uapi (the header the module is built from)
PROBE_IOCTLS = {"VERSION": "IOC_VERSION", "ATTACH": "IOC_ATTACH", "DETACH": "IOC_DETACH",
                "READ": "IOC_READ", "STATS": "IOC_STATS", "UNMARK": "IOC_UNMARK",
                "READ_REGIONS": "IOC_READ_REGIONS", "READ_PAGES": "IOC_READ_PAGES"}
PROBE_DEFINES = {
    "PAGETIER_MODE_FAULT": "MODE_FAULT", "PAGETIER_MODE_ABIT": "MODE_ABIT",
    "PAGETIER_SCAN_PERIOD_MIN_MS": "SCAN_PERIOD_MIN_MS",
    "PAGETIER_SCAN_PERIOD_MAX_MS": "SCAN_PERIOD_MAX_MS",
    "PAGETIER_SAMPLE_RATIO_MAX": "SAMPLE_RATIO_MAX", "PAGETIER_REC_PRESENT": "REC_PRESENT",
    "PAGETIER_REC_HUGE": "REC_HUGE", "PAGETIER_REC_ACCESSED": "REC_ACCESSED",
    "PAGETIER_NODE_NONE": "NODE_NONE", "PAGETIER_READ_RESET": "READ_RESET",
    "PAGETIER_READ_ACCESSED_ONLY": "READ_ACCESSED_ONLY", "PAGETIER_UNMARK_MAX": "UNMARK_MAX",
    "PAGETIER_IOC_MAGIC": "IOC_MAGIC", "PAGETIER_VERSION_MAJOR": "VERSION_MAJOR",
    "PAGETIER_VERSION_MINOR": "VERSION_MINOR", "PAGETIER_VERSION_PATCH": "VERSION_PATCH",
    "PAGETIER_REGION_SHIFT": "REGION_SHIFT", "PAGETIER_REGION_SIZE": "REGION_SIZE",
    "PAGETIER_REGION_HUGE": "REGION_HUGE", "PAGETIER_REGION_ACCESSED": "REGION_ACCESSED",
    "PAGETIER_REGION_MIXED": "REGION_MIXED", "PAGETIER_REGION_IDLE": "REGION_IDLE",
    "PAGETIER_REC_SHMEM": "REC_SHMEM", "PAGETIER_REC_FILE": "REC_FILE",
    "PAGETIER_REC_SHARED": "REC_SHARED", "PAGETIER_REGION_SHMEM": "REGION_SHMEM",
    "PAGETIER_REGION_FILE": "REGION_FILE", "PAGETIER_REGION_SHARED": "REGION_SHARED",
    "PAGETIER_ATTACH_READONLY_FILES": "ATTACH_READONLY_FILES",
}


@pytest.fixture(scope="module")
def c_values(tmp_path_factory) -> dict[str, int]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on this machine")
    include = REPO / "kmod" / "include" / "uapi"
    lines = ['#include <stdio.h>', '#include <linux/pagetier.h>', 'int main(void) {']
    for name in PROBE_IOCTLS:
        lines.append(f'printf("IOC_{name} %llu\\n", (unsigned long long)PAGETIER_IOC_{name});')
    for struct in uapi.STRUCTS:
        lines.append(f'printf("sizeof {struct} %zu\\n", sizeof(struct {struct}));')
    for define in PROBE_DEFINES:
        lines.append(f'printf("{define} %llu\\n", (unsigned long long)({define}));')
    lines.append("return 0; }")
    d = tmp_path_factory.mktemp("uapi_probe")
    (d / "probe.c").write_text("\n".join(lines) + "\n")
    build = subprocess.run([cc, "-Wall", "-Werror", f"-I{include}", "-o", str(d / "probe"),
                            str(d / "probe.c")], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(d / "probe")], capture_output=True, text=True, check=True).stdout
    return {k: int(v) for k, v in (line.rsplit(" ", 1) for line in out.splitlines())}


@pytest.mark.parametrize("name", list(PROBE_IOCTLS))
def test_ioctl_number_matches_the_compiled_header(c_values, name):
    py = getattr(uapi, PROBE_IOCTLS[name])
    assert py == c_values[f"IOC_{name}"], f"PAGETIER_IOC_{name}: C {c_values[f'IOC_{name}']:#x}, " \
                                           f"pagetier.uapi {py:#x}"


def test_struct_sizes_and_constants_match_the_compiled_header(c_values):
    for struct, dtype in uapi.STRUCTS.items():
        assert dtype.itemsize == c_values[f"sizeof {struct}"], struct
    for define, attr in PROBE_DEFINES.items():
        assert getattr(uapi, attr) == c_values[define], define


def test_flags_of_one_field_are_distinct_bits():
    """Each flags field's bits (0.5 added the kinds of memory) are single bits, none shared."""
    rec = [uapi.REC_PRESENT, uapi.REC_HUGE, uapi.REC_ACCESSED, uapi.REC_SHMEM, uapi.REC_FILE,
           uapi.REC_SHARED]
    region = [uapi.REGION_HUGE, uapi.REGION_ACCESSED, uapi.REGION_MIXED, uapi.REGION_IDLE,
              uapi.REGION_SHMEM, uapi.REGION_FILE, uapi.REGION_SHARED]
    for bits in (rec, region):
        assert all(b and b & (b - 1) == 0 for b in bits)
        assert len(set(bits)) == len(bits)


def test_05_fields_keep_the_04_layout():
    """0.5 took reserved space only: a 0.4 reader's offsets and sizes still hold."""
    assert uapi.ATTACH_T.itemsize == 56 and uapi.ATTACH_T.fields["flags"][1] == 24
    assert uapi.ATTACH_T.fields["reserved"][1] == 32
    assert uapi.STATS_T.itemsize == 120
    assert uapi.STATS_T.fields["pages_shmem"][1] == 104
    assert uapi.STATS_T.fields["pages_file"][1] == 112
    assert uapi.RECORD_T.itemsize == 24 and uapi.REGION_T.itemsize == 40

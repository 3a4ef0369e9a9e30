"""The Python view of the UAPI matches the structs the compiler laid out in pagetier.ko."""
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from pagetier import uapi

BUILT = sorted((Path(__file__).resolve().parent.parent / "build" / "kmod").glob("*/pagetier.ko"))


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
    cmds = [uapi.IOC_VERSION, uapi.IOC_ATTACH, uapi.IOC_DETACH, uapi.IOC_READ, uapi.IOC_STATS]
    assert len(set(cmds)) == len(cmds)
    assert (uapi.IOC_READ >> 16) & 0x3FFF == uapi.READ_T.itemsize

"""The shape of an `nvidia-smi -q` text: indented `Key : Value` lines parsed into nested dicts, the
capture file's `# <phase> :: <command>` sections, and the input formats a capture may come in.

`read_sections` accepts what the importer (gpuobs.sim.capture) and the fidelity report
(gpuobs.sim.fidelity) read: a capture file with banners (shared/captures/README.md) or a bare
`nvidia-smi -q` text (no banner: it is taken as the load phase's `-q` section); `nvidia-smi -q -x`
XML is refused with a ValueError naming it (not read yet). Line names
whose spelling changed between driver releases are read case-insensitively where the block's set
of names is known (R470-R550 print `Utilization/Gpu`, later releases `GPU`; R470 prints `Ecc Mode`),
and stored under one spelling, so that the importer and the field tables know one name per line.
"""

from __future__ import annotations

import re
from typing import Any

from .smi_text import VALUE

__all__ = ["GPU_KEY", "QUERY", "parse_query", "read_sections", "sections", "tree"]

_BANNER = re.compile(r"^#{20,}\n# ([\w-]+) :: (.+?)[ \t]*\n(?:#[^\n]*\n)*?#{20,}[ \t]*\n", re.M)
_LINE = re.compile(r"^( *)(\S.*?)\s*:(?:\s+(.*?))?\s*$")  # "Key   : value" (value optional)
GPU_KEY = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+$")
QUERY = "query (-q)"  # the title of a capture's `nvidia-smi -q` sections
_BARE_PHASE = "load"  # the phase a bare `-q` text (no banner) is filed under
_GPU_BLOCK = "<gpu>"  # _SPELLINGS key for the lines directly inside a `GPU dddddddd:bb:dd.f` block

# Blocks whose line names are a known set -> those names as the importer reads them (any case matches).
_SPELLINGS: dict[str, dict[str, str]] = {
    block: {name.lower(): name for name in names} for block, names in {
        "Utilization": ("GPU", "Memory", "Encoder", "Decoder", "JPEG", "OFA"),
        _GPU_BLOCK: ("ECC Mode", "ECC Errors", "MIG Mode", "FB Memory Usage", "BAR1 Memory Usage"),
    }.items()}


def _spelling(parent: str, key: str) -> str:
    """`key` as the importer spells it, when `parent` (the enclosing block's name) has a known set."""
    block = _GPU_BLOCK if GPU_KEY.match(parent) else parent
    return _SPELLINGS.get(block, {}).get(key.lower(), key)


def _rows(text: str) -> list[tuple[int, str, str | None]]:
    """(indent, key, value or None for a bare header) per meaningful line."""
    rows: list[tuple[int, str, str | None]] = []
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith(("#", "====")):
            continue
        m = _LINE.match(raw)
        if m:
            rows.append((len(m[1]), m[2], m[3] if m[3] is not None else ""))
        else:  # a bare header such as "GPU 00000000:00:09.0" or "    PCI"
            rows.append((len(raw) - len(raw.lstrip(" ")), raw.strip(), None))
    return rows


def tree(text: str) -> dict[str, Any]:
    """Parse an indented `Key : Value` text into nested dicts (see parse_query)."""
    rows = _rows(text)
    root: dict[str, Any] = {}
    stack: list[tuple[int, str, dict[str, Any]]] = [(-1, "", root)]
    for i, (indent, key, value) in enumerate(rows):
        while stack[-1][0] >= indent:
            stack.pop()
        parent_key, parent = stack[-1][1], stack[-1][2]
        key = _spelling(parent_key, key)
        node: Any = value if value is not None else ""
        if i + 1 < len(rows) and rows[i + 1][0] > indent:  # opens a sub-block
            node = {VALUE: value} if value else {}
            stack.append((indent, key, node))
        if key in parent:
            if not isinstance(parent[key], list):
                parent[key] = [parent[key]]
            parent[key].append(node)
        else:
            parent[key] = node
    return root


def parse_query(text: str) -> list[dict]:
    """Parse one `nvidia-smi -q` output into one tree per `GPU dddddddd:bb:dd.f` block.

    Each tree maps keys to raw (stripped) value strings, to dicts for sub-blocks, or to lists
    when a key repeats in the same block (e.g. several `MIG Device`, `Process ID`). A line with
    both a value and a sub-block (`Process ID : 1234` + Type/Name, `HW Slowdown : Active` +
    its sub-reasons) becomes a dict whose `"_value"` key holds the value. Trees keep input order.
    Returns [] when the text holds no GPU block; never raises on odd lines (they are kept as keys).
    """
    return [v for k, v in tree(text).items() if GPU_KEY.match(k) and isinstance(v, dict)]


def sections(text: str) -> dict[tuple[str, str], str]:
    """Split a capture file into {(phase, title): body}, e.g. ("load", "query (-q)").

    phase is the banner's first word ("capabilities", "idle", "load"), title the rest after
    "::". The body is the text between the banner and the next one, without leading/trailing
    blank lines. A repeated (phase, title) keeps the last body. Text before the first banner
    (the file header) is dropped.
    """
    marks = list(_BANNER.finditer(text))
    out: dict[tuple[str, str], str] = {}
    for m, nxt in zip(marks, marks[1:] + [None]):
        body = text[m.end(): nxt.start() if nxt else len(text)]
        out[(m[1], m[2].strip())] = body.strip("\n")
    return out


def read_sections(text: str) -> dict[tuple[str, str], str]:
    """The sections of any accepted input: a capture file's banners (see sections); else a bare
    `nvidia-smi -q` text, as the load phase's `-q` section. Raises ValueError for `nvidia-smi -q -x`
    XML (not read). Returns {} when the text is neither (no banner and no GPU block)."""
    found = sections(text)
    if found:
        return found
    if text.lstrip().startswith("<"):
        # `nvidia-smi -q -x`: its element names differ from the text's line names throughout, and mapping
        # them all is not done yet; refused by name rather than read as a text with no GPU in it
        raise ValueError("nvidia-smi -q -x XML is not read: capture the text output of nvidia-smi -q")
    if any(GPU_KEY.match(line.strip()) for line in text.splitlines()):
        return {(_BARE_PHASE, QUERY): text.strip("\n")}
    return {}

"""Text and HTML renderings of `%gpumem`'s three results: the memory map, a release, and the per-cell history.
Every value in the HTML is escaped: paths, cell lines, notes and advice all come from the user's notebook.

The first text line is the verdict: how much of each device the names explain, what a release gave back, or how
many cells keep growing. What was *not* freed, and who holds it, is always shown: it is the next thing to type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Any

from jupyter_gpu.gpumem.collector import collector_paused
from jupyter_gpu.gpumem.reconcile import total_line
from jupyter_gpu.gpumem.result import (
    CellRecord,
    DeviceLevel,
    FreeReport,
    Leak,
    MemoryEntry,
    MemoryHistory,
    MemoryMap,
    StillHeld,
)
from jupyter_gpu.rendering.kit import COLOUR, NUMBER_CELL_STYLE, table_text
from jupyter_gpu.rendering.units import format_bytes, format_count, format_growth, format_seconds

ENTRY_HEADINGS = ("name", "what", "device", "dtype", "shape", "size", "also held by")
LEVEL_HEADINGS = ("device", "allocated before", "allocated after", "change")
RESERVED_HEADINGS = ("reserved before", "reserved after")
HISTORY_HEADINGS = ("In [n]", "cell", "allocated after", "change", "new entries")
# Columns a text table right-aligns: numbers line up on their last digit.
NUMERIC_HEADINGS = ("size", "allocated before", "allocated after", "change", "reserved before", "reserved after")
OTHER_NAMES_WIDTH = 60
CELL_WIDTH = 40
LEAK_CELL_WIDTH = 60
NEW_ENTRIES_SHOWN = 3
LEAK_HINT = "keep only what you need (`losses.append(loss.item())`, not the tensor)"
NOTHING_RECORDED = "%gpumem --watch records memory after every cell"

CELL_STYLE = 'style="text-align:left;padding-right:1em"'
NUMBER_STYLE = f'style="{NUMBER_CELL_STYLE}"'  # a figure never wraps ("2.0 MiB" on two lines at 800 px)
TABLE_OPEN = '<table style="margin:.4em 0;font-size:.92em;font-variant-numeric:tabular-nums">'
NOTE_STYLE = 'style="opacity:.8"'


# -- shared helpers -----------------------------------------------------------------------------------------------

def _shorten(text: str, width: int) -> str:
    """The first line of `text`, cut to `width` characters with "…" when longer."""
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= width else line[:width - 1] + "…"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _table_html(table: list[tuple[str, ...]]) -> str:
    """A table (its first row the headings), every cell escaped, numeric columns right-aligned."""
    numeric = {i for i, heading in enumerate(table[0]) if heading in NUMERIC_HEADINGS}
    parts = [TABLE_OPEN, "<tr>" + "".join(f"<th {NUMBER_STYLE if i in numeric else CELL_STYLE}>{escape(heading)}</th>"
                                          for i, heading in enumerate(table[0])) + "</tr>"]
    parts.extend("<tr>" + "".join(f"<td {NUMBER_STYLE if i in numeric else CELL_STYLE}>{escape(value)}</td>"
                                  for i, value in enumerate(row)) + "</tr>" for row in table[1:])
    parts.append("</table>")
    return "".join(parts)


def _open_div(name: str, headline: str, colour: str) -> list[str]:
    return [f'<div class="jupyter-gpu-gpumem-{name}" style="font-family:var(--jp-ui-font-family,sans-serif);'
            'line-height:1.4">',
            f'<div style="font-weight:600;color:{colour}">{escape(headline)}</div>']


def _lines_html(lines: list[str], style: str = NOTE_STYLE) -> list[str]:
    return [f"<div {style}>{escape(line)}</div>" for line in lines]


def _notes(notes: tuple[str, ...]) -> list[str]:
    return [f"note: {note}" for note in notes]


# -- the memory map -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EntryGroup:
    """Storages with the same path, kind and device shown as one row: the 14 saved tensors of `graph of loss`."""

    path: str
    kind: str
    device: str
    entries: tuple[MemoryEntry, ...]

    @property
    def bytes(self) -> int:
        return sum(entry.bytes for entry in self.entries)

    @property
    def dtype(self) -> str:
        dtypes = {entry.dtype for entry in self.entries}
        return self.entries[0].dtype if len(dtypes) == 1 else "mixed"

    @property
    def shape(self) -> str:
        if len(self.entries) > 1:
            return f"{len(self.entries)} tensors"
        shape = self.entries[0].shape
        return "×".join(str(size) for size in shape) if shape else "scalar"

    @property
    def other_names(self) -> str:
        """`y, Out[3]` (cut to about 60 characters), then `+N more` for the names the walk counted but kept not."""
        others: list[str] = []
        for entry in self.entries:
            others.extend(name for name in entry.names if name != self.path and name not in others)
        more = sum(entry.more_names for entry in self.entries)
        text = _shorten(", ".join(others), OTHER_NAMES_WIDTH)
        if more:
            text = f"{text} +{more} more" if text else f"+{more} more"
        return text


def entry_groups(result: MemoryMap) -> list[EntryGroup]:
    """Every (path, kind, device) group, largest first; ties keep the walk's order."""
    grouped: dict[tuple[str, str, str], list[MemoryEntry]] = {}
    for entry in result.entries:
        grouped.setdefault((entry.path, entry.kind, entry.device), []).append(entry)
    groups = [EntryGroup(path, kind, device, tuple(entries)) for (path, kind, device), entries in grouped.items()]
    return sorted(groups, key=lambda group: -group.bytes)


def map_headline(result: MemoryMap) -> str:
    """`gpumem: cuda:0: 1.2 GiB named of 1.3 GiB allocated (96%); cpu: ...`."""
    if result.devices:
        return "gpumem: " + "; ".join(total_line(totals) for totals in result.devices)
    if result.entries:
        return f"gpumem: {format_bytes(result.named_bytes)} named"
    return "gpumem: no tensors in this notebook"


def entry_table(result: MemoryMap, groups: list[EntryGroup] | None = None) -> list[tuple[str, ...]]:
    """The headings, then one row per group for the `top` largest groups (`groups`: entry_groups, made once)."""
    groups = entry_groups(result) if groups is None else groups
    rows = [(group.path, group.kind, group.device, group.dtype, group.shape, format_bytes(group.bytes),
             group.other_names) for group in groups[:max(result.top, 0)]]
    return [ENTRY_HEADINGS, *rows]


def rest_line(result: MemoryMap, groups: list[EntryGroup] | None = None) -> str | None:
    """`… and 12 more entries, 3.0 MiB`: what the table leaves out, summed; None when it shows every group."""
    hidden = (entry_groups(result) if groups is None else groups)[max(result.top, 0):]
    if not hidden:
        return None
    storages = sum(len(group.entries) for group in hidden)
    tensors = f" ({storages} tensors)" if storages != len(hidden) else ""
    size = format_bytes(sum(group.bytes for group in hidden))
    if result.top <= 0:
        return f"{_plural(len(hidden), 'entry', 'entries')}{tensors}, {size}, not listed"
    return f"… and {len(hidden)} more {'entry' if len(hidden) == 1 else 'entries'}{tensors}, {size}"


def totals_lines(result: MemoryMap) -> list[str]:
    """Per device: its headline, then each remainder with the advice that fits it."""
    lines: list[str] = []
    for totals in result.devices:
        lines.append(total_line(totals))
        for remainder in result.remainders:
            if remainder.device != totals.device:
                continue
            lines.append(f"  + {format_bytes(remainder.bytes)} {remainder.label}")
            if remainder.advice:
                lines.append(f"    → {remainder.advice}")
    return lines


def release_lines(result: MemoryMap) -> list[str]:
    """`to give back: f.cache_clear() empties the lru_cache of f (6.0 MiB; the function stays)`, one per release."""
    return [f"to give back: {release.line} empties {release.holder} ({format_bytes(release.bytes)}"
            + (f"; {release.keeps})" if release.keeps else ")") for release in result.releases]


def footer_line(result: MemoryMap) -> str:
    return f"walked {format_count(result.objects_visited)} objects in {format_seconds(result.seconds)}"


def _map_text(result: MemoryMap) -> str:
    lines = [map_headline(result)]
    groups = entry_groups(result)
    table = entry_table(result, groups)
    if len(table) > 1:
        lines.extend(table_text(table, NUMERIC_HEADINGS))
    rest = rest_line(result, groups)
    if rest is not None:
        lines.append(rest)
    lines.extend(totals_lines(result))
    lines.extend(release_lines(result))
    lines.extend(_notes(result.notes))
    lines.append(footer_line(result))
    return "\n".join(lines)


def _map_html(result: MemoryMap) -> str:
    parts = _open_div("map", map_headline(result), COLOUR["info"])
    groups = entry_groups(result)
    table = entry_table(result, groups)
    if len(table) > 1:
        parts.append(_table_html(table))
    rest = rest_line(result, groups)
    if rest is not None:
        parts.extend(_lines_html([rest]))
    for totals in result.devices:
        parts.append(f'<div style="margin-top:.3em;font-weight:600">{escape(total_line(totals))}</div>')
        for remainder in result.remainders:
            if remainder.device != totals.device:
                continue
            parts.append(f'<div style="margin-left:1em">+ {escape(format_bytes(remainder.bytes))} '
                         f"{escape(remainder.label)}</div>")
            if remainder.advice:
                parts.append(f'<div style="margin-left:2em;opacity:.8">→ {escape(remainder.advice)}</div>')
    parts.extend(_lines_html(release_lines(result), 'style="margin-top:.3em"'))
    parts.extend(_lines_html(_notes(result.notes)))
    parts.extend(_lines_html([footer_line(result)], 'style="opacity:.6;font-size:.9em"'))
    parts.append("</div>")
    return "".join(parts)


# -- a release ----------------------------------------------------------------------------------------------------

def _devices(result: FreeReport) -> list[str]:
    """Every device either side of the release, in the order first seen."""
    return list(dict.fromkeys(level.device for level in (*result.before, *result.after)))


def _level(levels: tuple[DeviceLevel, ...], device: str) -> DeviceLevel | None:
    return next((level for level in levels if level.device == device), None)


def _reserved_returned(result: FreeReport, device: str) -> int:
    """Reserved bytes the allocator handed back to the driver (what `--free cache` does), never negative."""
    before, after = _level(result.before, device), _level(result.after, device)
    if before is None or after is None or before.reserved_bytes is None or after.reserved_bytes is None:
        return 0
    return max(before.reserved_bytes - after.reserved_bytes, 0)


def free_headline(result: FreeReport) -> str:
    """`gpumem --free outputs: gave back 1.0 GiB on cuda:0`, or that nothing was given back."""
    parts = []
    for device in _devices(result):
        freed, returned = result.freed_bytes(device), _reserved_returned(result, device)
        if freed:
            parts.append(f"{format_bytes(freed)} on {device}")
        elif returned:
            # Emptying the cache frees no tensor: it is the reserved memory that goes back to other processes.
            parts.append(f"{format_bytes(returned)} of reserved memory on {device}")
    text = f"gpumem --free {result.target}: " + (f"gave back {', '.join(parts)}" if parts
                                                 else "nothing was given back")
    if result.still_held:
        text += f"; {len(result.still_held)} still held (see below)"
    return text


def level_table(result: FreeReport) -> list[tuple[str, ...]]:
    """Device, allocated before and after, the change, and reserved before and after where the device has them."""
    with_reserved = any(level.reserved_bytes is not None for level in (*result.before, *result.after))
    headings = LEVEL_HEADINGS + (RESERVED_HEADINGS if with_reserved else ())
    rows: list[tuple[str, ...]] = [headings]
    for device in _devices(result):
        before, after = _level(result.before, device), _level(result.after, device)
        allocated = (before.allocated_bytes if before else None, after.allocated_bytes if after else None)
        change = format_growth(allocated[1] - allocated[0]) if None not in allocated else "n/a"
        row = (device, format_bytes(allocated[0]), format_bytes(allocated[1]), change)
        if with_reserved:
            row += (format_bytes(before.reserved_bytes if before else None),
                    format_bytes(after.reserved_bytes if after else None))
        rows.append(row)
    return rows


def still_held_line(held: StillHeld) -> str:
    holders = ", ".join(held.held_by) if held.held_by else "a holder the walk could not name"
    return f"still held: {held.path} ({format_bytes(held.bytes)}) by {holders}"


def free_lines(result: FreeReport) -> list[str]:
    """Released names, what stays and who holds it, what to type next time, and the notes."""
    lines = [f"released: {', '.join(result.released)}"] if result.released else []
    lines.extend(still_held_line(held) for held in result.still_held)
    lines.extend(f"next time: {line}" for line in result.next_time)
    lines.extend(_notes(result.notes))
    return lines


def _free_text(result: FreeReport) -> str:
    lines = [free_headline(result)]
    table = level_table(result)
    if len(table) > 1:
        lines.extend(table_text(table, NUMERIC_HEADINGS))
    lines.extend(free_lines(result))
    return "\n".join(lines)


def _free_html(result: FreeReport) -> str:
    colour = COLOUR["ok"] if result.freed_bytes() and not result.still_held else COLOUR["warn"]
    parts = _open_div("free", free_headline(result), colour)
    table = level_table(result)
    if len(table) > 1:
        parts.append(_table_html(table))
    if result.released:
        parts.extend(_lines_html([f"released: {', '.join(result.released)}"]))
    parts.extend(_lines_html([still_held_line(held) for held in result.still_held],
                             f'style="color:{COLOUR["warn"]}"'))
    parts.extend(_lines_html([f"next time: {line}" for line in result.next_time], 'style="font-weight:600"'))
    parts.extend(_lines_html(_notes(result.notes)))
    parts.append("</div>")
    return "".join(parts)


# -- the history --------------------------------------------------------------------------------------------------

def history_headline(result: MemoryHistory) -> str:
    """`gpumem history: 5 cells recorded — watching; 1 cell keeps growing`."""
    if not result.records:
        if result.watching:
            return "gpumem history: nothing recorded yet — watching: memory is recorded after every cell"
        return f"gpumem history: nothing recorded yet; {NOTHING_RECORDED}"
    text = f"gpumem history: {_plural(len(result.records), 'cell', 'cells')} recorded"
    if result.watching:
        text += " — watching"
    if result.leaks:
        text += f"; {_plural(len(result.leaks), 'cell keeps', 'cells keep')} growing"
    return text


def _sized(pairs: tuple[tuple[str, int], ...], shown: int | None = None) -> str:
    """`x (4.0 MiB), Out[3] (1.0 MiB) +2 more`."""
    kept = pairs if shown is None else pairs[:shown]
    text = ", ".join(f"{path} ({format_bytes(size)})" for path, size in kept)
    return text + (f" +{len(pairs) - len(kept)} more" if len(kept) < len(pairs) else "")


def _history_row(record: CellRecord, growth: int, first: bool) -> tuple[str, ...]:
    # The first record has nothing before it: a blank says so, where "0 B" would read as "this cell added nothing".
    return (f"In [{record.execution_count}]", _shorten(record.cell, CELL_WIDTH), format_bytes(record.allocated_bytes),
            "" if first else format_growth(growth), _sized(record.new_entries, NEW_ENTRIES_SHOWN))


def history_table(result: MemoryHistory) -> list[tuple[str, ...]]:
    rows = [_history_row(record, growth, index == 0) for index, (record, growth) in enumerate(result.growth())]
    return [HISTORY_HEADINGS, *rows]


def leak_line(leak: Leak) -> str:
    """`leak? cell `x = f()` grew every time it ran: +4.0 MiB, ... (runs In [3], ...); its last run added: ...`."""
    grew = ", ".join(format_growth(size) for size in leak.growth)
    runs = ", ".join(f"In [{run}]" for run in leak.runs)
    text = f"leak? cell `{_shorten(leak.cell, LEAK_CELL_WIDTH)}` grew every time it ran: {grew} (runs {runs})"
    if leak.new_entries:
        text += f"; its last run added: {_sized(leak.new_entries, NEW_ENTRIES_SHOWN)}"
    return text


def _history_text(result: MemoryHistory) -> str:
    lines = [history_headline(result)]
    if result.records:
        lines.extend(table_text(history_table(result), NUMERIC_HEADINGS))
    lines.extend(leak_line(leak) for leak in result.leaks)
    if result.leaks:
        lines.append(f"  {LEAK_HINT}")
    lines.extend(_notes(result.notes))
    return "\n".join(lines)


def _history_html(result: MemoryHistory) -> str:
    parts = _open_div("history", history_headline(result), COLOUR["warn"] if result.leaks else COLOUR["info"])
    if result.records:
        parts.append(_table_html(history_table(result)))
    warn = f'style="color:{COLOUR["warn"]};font-weight:600"'
    parts.extend(_lines_html([leak_line(leak) for leak in result.leaks], warn))
    if result.leaks:
        parts.extend(_lines_html([LEAK_HINT]))
    parts.extend(_lines_html(_notes(result.notes)))
    parts.append("</div>")
    return "".join(parts)


# -- the renderings -----------------------------------------------------------------------------------------------

def render_text(result: MemoryMap | FreeReport | MemoryHistory) -> str:
    with collector_paused():
        return _renderers(result)[0](result)


def render_html(result: MemoryMap | FreeReport | MemoryHistory) -> str:
    with collector_paused():
        return _renderers(result)[1](result)


def _renderers(result: object) -> tuple[Callable[[Any], str], Callable[[Any], str]]:
    """(text, html) renderer of a result type."""
    for kind, renderers in ((MemoryMap, (_map_text, _map_html)), (FreeReport, (_free_text, _free_html)),
                            (MemoryHistory, (_history_text, _history_html))):
        if isinstance(result, kind):
            return renderers
    raise TypeError(f"gpumem cannot render a {type(result).__name__}")

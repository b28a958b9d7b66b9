#!/usr/bin/env python3
"""Checks that every #include in the source tree runs the way the layer table allows.

The table is the ```layers block of docs/architecture.md (section "Layers"), and only there:

    core/util core/tensor core/device:   # folders on one line may include one another
    core/comm: core/tensor               # may include core/tensor and what it may include
    ...

Each line names one or more folders (a unit) and, after the colon, the units it may include
directly; it may also include whatever those may include (the layers below them). A file
belongs to the longest listed folder that holds it; its project includes ("core/ops/x.h",
or a file beside it) must resolve to its own unit or one it may include. The table itself
must have no cycle, and every source file must belong to a listed folder.

usage: check_layers.py [--root DIR] [--table FILE]     exit 0: clean; 1: each problem named
"""
import argparse
import os
import re
import sys

SOURCE_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


class TableError(Exception):
    pass


def read_table(table_path):
    """The units (tuples of folders, in table order) and the units each lists after its colon."""
    text = open(table_path, encoding="utf-8").read()
    block = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    if not block:
        raise TableError(f"{table_path}: no ```layers block (the include layer table)")
    units, listed, unit_of_folder = [], {}, {}
    for number, raw in enumerate(block.group(1).split("\n"), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if ":" not in line:
            raise TableError(f"{table_path}: layers line {number}: 'folders: included folders' expected, got '{raw}'")
        left, right = line.split(":", 1)
        unit = tuple(left.split())
        for folder in unit:
            if folder in unit_of_folder:
                raise TableError(f"{table_path}: layers: folder {folder} listed twice")
            unit_of_folder[folder] = unit
        units.append(unit)
        listed[unit] = right.split()
    edges = {}
    for unit in units:
        edges[unit] = set()
        for folder in listed[unit]:
            if folder not in unit_of_folder:
                raise TableError(f"{table_path}: layers: {' '.join(unit)} may include {folder}, which the table does not list")
            edges[unit].add(unit_of_folder[folder])
    return units, edges, unit_of_folder


def reachable(edges):
    """For each unit, every unit it may include (directly or through others); raises on a cycle."""
    closure = {}

    def visit(unit, path):
        if unit in closure:
            return closure[unit]
        if unit in path:
            cycle = path[path.index(unit):] + [unit]
            raise TableError("layers: the table has a cycle: " + " -> ".join(" ".join(u) for u in cycle))
        result = set()
        for below in edges[unit]:
            result.add(below)
            result |= visit(below, path + [unit])
        closure[unit] = result
        return result

    for unit in edges:
        visit(unit, [])
    return closure


def unit_of(path, unit_of_folder):
    """The unit of a repository-relative path: its longest listed folder (None: unlisted)."""
    parts = path.split("/")
    for n in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:n])
        if folder in unit_of_folder:
            return unit_of_folder[folder]
    return None


def source_files(root, top_folders):
    for top in sorted(top_folders):
        for directory, subdirs, files in os.walk(os.path.join(root, top)):
            subdirs.sort()
            for name in sorted(files):
                if name.endswith(SOURCE_EXTENSIONS):
                    yield os.path.relpath(os.path.join(directory, name), root).replace(os.sep, "/")


def check(root, table_path):
    """The problems found, one message each (empty: the tree follows the table)."""
    try:
        units, edges, unit_of_folder = read_table(table_path)
        allowed = reachable(edges)
    except TableError as e:
        return [str(e)]
    top_folders = {folder.split("/")[0] for folder in unit_of_folder}
    problems = []
    for path in source_files(root, top_folders):
        unit = unit_of(path, unit_of_folder)
        if unit is None:
            problems.append(f"{path}: in no folder of the layer table ({os.path.relpath(table_path, root)})")
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                if target.split("/")[0] not in top_folders:
                    beside = os.path.normpath(os.path.join(os.path.dirname(path), target)).replace(os.sep, "/")
                    if not os.path.exists(os.path.join(root, beside)):
                        continue  # not a project file (a system or generated header)
                    target = beside
                target_unit = unit_of(target, unit_of_folder)
                if target_unit is None or target_unit == unit or target_unit in allowed[unit]:
                    continue
                problems.append(f"{path}:{number}: includes {target}: {' '.join(unit)} may not include "
                                f"{' '.join(target_unit)} (the layer table in {os.path.relpath(table_path, root)})")
    return problems


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")))
    parser.add_argument("--table", help="default: ROOT/docs/architecture.md")
    args = parser.parse_args()
    table = args.table or os.path.join(args.root, "docs", "architecture.md")
    problems = check(args.root, table)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)")
        return 1
    print("check_layers: every include follows the layer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())

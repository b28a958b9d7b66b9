#!/usr/bin/env python3
"""Counts the lines of every function defined in C++ sources, and fails on any longer than --max.

A function runs from the first line of its declaration to its closing brace, comments and
blank lines inside included; lambdas and local classes count towards the function that holds
them; class members defined in the class body are functions of their own. (A light scanner,
not a C++ parser: comments, strings and preprocessor lines are blanked first, then each brace
at namespace or class scope whose declaration has a parameter list opens a function.)

usage: check_function_length.py [--max N] [--list] PATH...   (files or folders)
exit 0: none over N; 1: each one over named with its length
"""
import argparse
import os
import re
import sys

SOURCE_EXTENSIONS = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
ATTRIBUTES = ("__launch_bounds__", "__attribute__", "__declspec", "alignas", "decltype")  # not names


def blank_non_code(text):
    """Comments, string and character literals and preprocessor lines -> spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c == "#":
            j = i
            while j < n and (text[j] != "\n" or text[j - 1] == "\\"):
                j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if c == "\n":
            at_line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and (text[i - 1].isalnum()):  # a digit separator: 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """(name, first line, last line) of each function defined in a C++ source text."""
    code = blank_non_code(text)
    stack = []  # kinds of the open braces: "scope" (namespace, class), "function", "inner"
    head_start = 0  # where the current declaration began (after the last ; { } at scope level)
    found = []
    line = 1
    line_at = [0] * (len(code) + 1)
    for i, c in enumerate(code):
        line_at[i] = line
        if c == "\n":
            line += 1
    in_function = lambda: any(k in ("function", "inner") for k, _, _ in stack)
    for i, c in enumerate(code):
        if c == "{":
            if in_function():
                stack.append(("inner", 0, ""))
                continue
            head = code[head_start:i]
            words = head.split()
            if re.search(r"\b(namespace|extern)\b", head) and ")" not in head:
                stack.append(("scope", 0, ""))
            elif re.search(r"\b(class|struct|union|enum)\b", head) and "(" not in head:
                stack.append(("scope", 0, ""))
            elif ")" in head and "=" not in head.split("(")[0]:
                first = head_start + (len(head) - len(head.lstrip()))
                names = [name for name in re.findall(r"([A-Za-z_~][\w:~<>]*(?:operator\s*\S+?)?)\s*\(", head)
                         if name not in ATTRIBUTES]
                stack.append(("function", line_at[first], names[0] if names else "?"))
            else:
                stack.append(("inner", 0, ""))  # an initializer at scope level
            head_start = i + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    found.append((name, start, line_at[i]))
            if not in_function():
                head_start = i + 1
        elif c == ";" and not in_function():
            head_start = i + 1
        elif c == ":" and not in_function() and re.search(r"\b(public|private|protected)\s*$", code[head_start:i]):
            head_start = i + 1
    return found


def source_files(paths):
    for p in paths:
        if os.path.isdir(p):
            for directory, subdirs, files in os.walk(p):
                subdirs.sort()
                for name in sorted(files):
                    if name.endswith(SOURCE_EXTENSIONS):
                        yield os.path.join(directory, name)
        else:
            yield p


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=120, help="the most lines a function may have (default 120)")
    parser.add_argument("--list", action="store_true", help="print every function with its length")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    over, count = [], 0
    for path in source_files(args.paths):
        for name, first, last in functions(open(path, encoding="utf-8", errors="replace").read()):
            count += 1
            length = last - first + 1
            if args.list:
                print(f"{length:5d}  {path}:{first}  {name}")
            if length > args.max:
                over.append(f"{path}:{first}: {name} has {length} lines (at most {args.max})")
    for o in over:
        print(o)
    if over:
        print(f"check_function_length: {len(over)} of {count} functions over {args.max} lines")
        return 1
    print(f"check_function_length: {count} functions, none over {args.max} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The structure checks catch what they are for: check_layers.py on small trees with a layer
table (a clean one, a wrong-way include, a file outside the table, a cycle in the table), and
check_function_length.py on functions of known lengths."""
import os
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_function_length  # noqa: E402
import check_layers  # noqa: E402

TABLE = """\
# Architecture

```layers
low/a low/b:      # one unit: may include each other
mid:   low/a      # and so low/b
high:  mid        # and so low
```
"""


def make_tree(root, files, table=TABLE):
    os.makedirs(os.path.join(root, "docs"), exist_ok=True)
    with open(os.path.join(root, "docs", "architecture.md"), "w") as f:
        f.write(table)
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)


CLEAN = {
    "low/a/a.h": '#include "low/b/b.h"\n#include <vector>\n',
    "low/b/b.h": '#include "low/a/a.h"\n',
    "mid/m.h": '#include "low/a/a.h"\n#include "beside.h"\n',
    "mid/beside.h": "\n",
    "high/h.cpp": '#include "mid/m.h"\n#include "low/b/b.h"\n#include "generated/not_here.h"\n',
}


def layer_problems(files, table=TABLE):
    with tempfile.TemporaryDirectory() as root:
        make_tree(root, files, table)
        return check_layers.check(root, os.path.join(root, "docs", "architecture.md"))


def test_layers():
    assert layer_problems(CLEAN) == [], layer_problems(CLEAN)

    wrong = dict(CLEAN)
    wrong["low/b/b.h"] = '#include "low/a/a.h"\n\n#include "mid/m.h"\n'
    problems = layer_problems(wrong)
    assert len(problems) == 1 and problems[0].startswith("low/b/b.h:3: includes mid/m.h: low/a low/b may not include mid"), problems

    upward = dict(CLEAN)
    upward["mid/m.h"] = '#  include "high/h.cpp"\n'
    problems = layer_problems(upward)
    assert len(problems) == 1 and "mid may not include high" in problems[0], problems

    outside = dict(CLEAN)
    outside["low/c.h"] = "\n"  # low/ itself is not a folder of the table
    problems = layer_problems(outside)
    assert len(problems) == 1 and problems[0].startswith("low/c.h: in no folder of the layer table"), problems

    cyclic = TABLE.replace("low/a low/b:", "low/a low/b: high")
    problems = layer_problems(CLEAN, cyclic)
    assert len(problems) == 1 and "the table has a cycle" in problems[0], problems

    unknown = TABLE.replace("high:  mid", "high:  mid nowhere")
    problems = layer_problems(CLEAN, unknown)
    assert len(problems) == 1 and "nowhere, which the table does not list" in problems[0], problems

    assert "no ```layers block" in layer_problems(CLEAN, "# no table\n")[0]


SOURCE = textwrap.dedent("""\
    namespace a {
    // a comment with a brace {
    int short_one(int x) {
      return x;
    }

    struct S {
      int member() const { return 1; }
      void longer(
          int y) {
        auto f = [&] {
          if (y) { y = 2; }
        };
        const char* s = "}}}";
        f();
      }
    };

    int table[] = {1, 2, 3};
    }  // namespace a
    """)


def test_function_lengths():
    found = {name: last - first + 1 for name, first, last in check_function_length.functions(SOURCE)}
    assert found == {"short_one": 3, "member": 1, "longer": 8}, found


if __name__ == "__main__":
    test_layers()
    test_function_lengths()
    print("structure checks: all cases pass")

"""Kernel names as the performance tools print them (bench/ptxas_report.py, ncu_traffic.py,
ncu_table.py): a demangled name with its return type, the anonymous namespaces and its
parameter list left out, its template arguments kept, and of its namespaces only the innermost
one, so that the same kernel reads the same in every tool:

  void nsatron::nsa::cuda::detail::(anonymous namespace)::tc::row_kernel<128, 1, 1, 0>(Geo, ...)
    -> tc::row_kernel<128, 1, 1, 0>
  nsatron::nsa::cuda::detail::key_kernel<float, 128, 0>(...) -> detail::key_kernel<float, 128, 0>
"""
import re

# ncu writes the anonymous namespace as "<unnamed>", c++filt as "(anonymous namespace)".
_ANONYMOUS = re.compile(r"\(anonymous namespace\)::|<unnamed>::")


def short_kernel_name(name):
    name = _ANONYMOUS.sub("", name.strip())
    name = re.sub(r"^void ", "", name)
    depth = 0
    for i, ch in enumerate(name):  # cut at the parameter list: the first '(' outside <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    cut = name.find("<")
    head, tail = (name, "") if cut < 0 else (name[:cut], name[cut:])
    return "::".join(head.split("::")[-2:]) + tail

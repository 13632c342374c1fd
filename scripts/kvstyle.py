"""kvstyle.py: the one figure style of every kvbench plot script (issue 16,
point 2): a fixed colour and marker per method name, the same in every
figure the project draws; a deterministic fallback for names not in the
table; figure-level legends outside the data; saving without clipping;
and finding an interpreter with matplotlib.

Colours: the exact oracle black, the two floors grey (random) and brown
(streaming), the evaluated methods from Paul Tol's colour-blind-safe
"bright" and "muted" sets, the Faiss family in purples/teals; every
method also has its own marker so lines stay distinguishable in grey
print. A name not in the table gets a colour and marker chosen by a hash
of the name (sha1, so the same name gets the same style on every machine
and in every run), from a palette disjoint from the fixed colours.

Import it from a script in scripts/ (the scripts put their own folder on
sys.path first), and call need_matplotlib() before importing pyplot.
"""
import hashlib
import os
import sys

METHOD_STYLE = {
    # oracle and floors
    "exact": ("#000000", "o"),
    "random": ("#9e9e9e", "x"),
    "streaming": ("#8c564b", "v"),
    "sink-nearest": ("#c49c94", "<"),
    "sampled": ("#CC79A7", "X"),
    # evaluated methods (Tol bright / muted)
    "pariskv": ("#EE6677", "s"),
    "pqcache": ("#4477AA", "^"),
    "quest": ("#228833", "D"),
    "magicpig": ("#CCBB44", "P"),
    "freekv": ("#66CCEE", ">"),
    "ctkvr": ("#AA3377", "*"),
    "csattention": ("#E69F00", "h"),
    "racc": ("#D55E00", "p"),
    # Faiss baselines
    "faiss-flat": ("#332288", "1"),
    "faiss-ivf": ("#5E3C99", "d"),
    "faiss-ivfpq": ("#44AA99", "2"),
    "faiss-hnsw": ("#882255", "3"),
}

# For names not in the table: no colour of the table above.
_FALLBACK_COLORS = ["#56B4E9", "#009E73", "#0072B2", "#999933", "#6699CC", "#997700", "#994455", "#EE99AA",
                    "#004488", "#BB5566", "#DDCC77", "#AA4499"]
_FALLBACK_MARKERS = ["o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p"]


def style(method):
    """(colour, marker) of a method name: fixed for known names, else by sha1 of the name."""
    if method in METHOD_STYLE:
        return METHOD_STYLE[method]
    h = int(hashlib.sha1(method.encode()).hexdigest(), 16)
    return _FALLBACK_COLORS[h % len(_FALLBACK_COLORS)], _FALLBACK_MARKERS[(h // 97) % len(_FALLBACK_MARKERS)]


def method_order(names):
    """Known methods in the table's order (oracle, floors, methods, Faiss), then the others sorted."""
    known = [m for m in METHOD_STYLE if m in names]
    return known + sorted(n for n in names if n not in METHOD_STYLE)


def need_matplotlib(script):
    """Imports matplotlib with the Agg backend. When the running interpreter
    lacks it, re-executes the script with the project's .venv/bin/python
    (where `make pydeps` installs it) if there is one; otherwise exits with
    a one-line message saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        venv = os.environ.get("KVBENCH_VENV", os.path.join(root, ".venv"))
        venv_py = os.path.join(venv, "bin", "python")
        # a venv's python is a symlink to the base interpreter: compare prefixes, not executables
        if os.path.isfile(venv_py) and os.path.realpath(sys.prefix) != os.path.realpath(venv) \
                and not os.environ.get("KVBENCH_PLOT_REEXEC"):
            os.environ["KVBENCH_PLOT_REEXEC"] = "1"
            os.execv(venv_py, [venv_py, os.path.abspath(sys.argv[0])] + sys.argv[1:])
        sys.exit(f"{script}: matplotlib is not installed for {sys.executable} and no {venv_py} has it "
                 f"(run `make pydeps`, then `.venv/bin/python scripts/{script} ...`)")
    matplotlib.use("Agg")
    return matplotlib


def legend_outside(fig, methods, ncol=None):
    """One legend for the whole figure, below the panels: a line with its
    marker per method, in method_order."""
    from matplotlib.lines import Line2D
    names = method_order(methods)
    handles = [Line2D([], [], color=style(m)[0], marker=style(m)[1], markersize=6, linewidth=1.8, label=m)
               for m in names]
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol or min(len(names), 8), frameon=False,
               fontsize=9)


def save(fig, path, dpi=130):
    """Writes the figure atomically with a tight bounding box (nothing clipped)."""
    tmp = path + ".tmp" + os.path.splitext(path)[1]
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    os.replace(tmp, path)

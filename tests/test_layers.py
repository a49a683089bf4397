"""The house's rooms (pyproject.toml's [tool.stoker.rooms], read by tests/rooms.py) and which way
its arrows may point.

protos (the wire: messages, framing, sockets, keys) is the floor and knows no images or text;
pipeline (the data model, no sockets) stands on its message-level modules only, to translate the
job and its units into messages; workers (CPU hosts) and accel (the consumer) each stand on both
and never on each other; the control plane in accel/control is used by the consumer and uses none
of it. The modules of stoker/ itself (the CLI), benchmarks/ and tests/ sit on top. Every import is read from the
source, including imports inside functions, so a lazy import cannot hide an arrow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.rooms import MAY_IMPORT, PACKAGE, project_modules, room_of

ROOT = Path(__file__).resolve().parent.parent
# what the data model may use of the wire: the messages and their limits, not sockets, keys or clients
PIPELINE_MAY_USE = {"protos.stoker_pb2", "protos.framing", "protos.message_fit", "protos.errors"}
GRAPH_FOLDERS = ("stoker", "benchmarks", "tests")


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, by its full dotted name."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path}:{node.lineno}: relative import; spell the package out")
    return found


def broken_arrows(room: str, package: Path = PACKAGE) -> list[str]:
    """Each import in `room`'s modules (those under its folder of `package`, the stoker/ folder, that no
    deeper room holds) of a room it may not use, named relative to the package:
    "workers.bad:2 imports accel.consumer"."""
    bad = []
    for path in sorted((package / room.replace(".", "/")).rglob("*.py")):
        name = ".".join(path.relative_to(package).with_suffix("").parts)
        if room_of(name) != room:
            continue
        seen: set[tuple[int, str | None]] = set()
        for line, full in imports_of(path):
            if not full.startswith("stoker."):
                continue
            target = full.removeprefix("stoker.")
            to = room_of(target)
            if to not in MAY_IMPORT[room] and (line, to) not in seen:  # once per statement and room
                seen.add((line, to))
                bad.append(f"{name}:{line} imports {target}")
            if room.startswith("pipeline") and to == "protos" and target != "protos" and _is_module(package, target) \
                    and not any(target == ok or target.startswith(ok + ".") for ok in PIPELINE_MAY_USE):
                bad.append(f"{name}:{line} imports {target} (the data model uses only the wire's messages)")
    return sorted(set(bad))


def room_cycles() -> list[str]:
    """Rooms the table lets reach themselves through another room: the table's arrows must point down."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in MAY_IMPORT[todo.pop()] - {start}:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
    return [room for room in MAY_IMPORT if any(room in MAY_IMPORT[other] for other in reach(room))]


def _is_module(root: Path, dotted: str) -> bool:
    where = root / Path(*dotted.split("."))
    return where.with_suffix(".py").exists() or where.is_dir()


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_no_upward_or_sideways_import(room):
    assert broken_arrows(room) == []


def test_the_rooms_arrows_point_one_way():
    assert room_cycles() == []
    assert all(room in allowed and allowed <= MAY_IMPORT.keys() for room, allowed in MAY_IMPORT.items())


def test_every_package_of_stoker_is_a_room_or_in_one():
    """A new folder belongs to a room (the one above it) or is one of the top's own: the emulated cluster
    (stoker/lab) and the command line's commands (stoker/commands)."""
    packages = {".".join(init.parent.relative_to(PACKAGE).parts) for init in PACKAGE.rglob("*/__init__.py")}
    assert {p for p in packages if room_of(p) is None} <= {"lab", "commands"}


def test_the_walk_catches_an_arrow(tmp_path):
    """The check itself: a lazy import of the consumer from a worker, and the control plane
    importing the receiver, are both found."""
    for room in ("workers", "accel/control"):
        (tmp_path / room).mkdir(parents=True)
    (tmp_path / "workers" / "bad.py").write_text("def f():\n    from stoker.accel.consumer import Consumer\n")
    (tmp_path / "accel" / "receiver.py").write_text("")
    (tmp_path / "accel" / "control" / "bad.py").write_text("from stoker.accel import receiver\n")
    assert broken_arrows("workers", tmp_path) == ["workers.bad:2 imports accel.consumer"]
    assert broken_arrows("accel.control", tmp_path) == ["accel.control.bad:1 imports accel"]


def test_the_walk_catches_the_data_model_reaching_for_a_socket(tmp_path):
    """The data model may import the messages (here a module of them) but not the wire's sockets."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "protos").mkdir()
    for module in ("stoker_pb2", "framing", "sockets"):
        (tmp_path / "protos" / f"{module}.py").write_text("")
    (tmp_path / "pipeline" / "bad.py").write_text(
        "from stoker.protos import stoker_pb2 as pb\nfrom stoker.protos.framing import ALLOWED_DTYPES\n"
        "def f():\n    from stoker.protos.sockets import dealer\n")
    assert broken_arrows("pipeline", tmp_path) == [
        "pipeline.bad:4 imports protos.sockets (the data model uses only the wire's messages)"]


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Every module of the project and the project modules it imports (a `from package import
    name` that names a module is an arrow to that module; one that names a class is an arrow to
    the package). Lazy imports and `if TYPE_CHECKING:` imports count: each is an arrow a reader
    must follow."""
    modules = project_modules(root, GRAPH_FOLDERS)
    graph = {}
    for name, path in modules.items():
        targets = {target for _, target in imports_of(path)}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """Each cycle in the module graph once, as the modules along it (Tarjan's strongly connected
    components: a component of more than one module holds a cycle)."""
    graph = module_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(start: str) -> None:  # iterative: a deep import chain must not hit the recursion limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, arrows = work[-1]
            target = next(arrows, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def test_no_import_cycle_between_modules():
    assert import_cycles() == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    """a -> b at the top, b -> c inside a function, c -> a under TYPE_CHECKING: one cycle of three;
    d imports a and is in none."""
    accel = tmp_path / "stoker" / "accel"
    accel.mkdir(parents=True)
    (accel / "__init__.py").write_text("")
    (accel / "a.py").write_text("from stoker.accel.b import thing\n")
    (accel / "b.py").write_text("def thing():\n    from stoker.accel import c\n")
    (accel / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import stoker.accel.a\n")
    (accel / "d.py").write_text("import stoker.accel.a\n")
    assert import_cycles(tmp_path) == [["stoker.accel.a", "stoker.accel.b", "stoker.accel.c"]]

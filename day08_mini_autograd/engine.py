"""A scalar autograd engine: every number remembers how it was made, so `backward()` can apply the chain rule.

Each `Value` keeps up to two inputs (`_a`, `_b`) and the local derivative of itself with respect to each
(`_da`, `_db`), computed once in the forward pass. `backward()` orders the graph topologically and walks it in
reverse, doing `input.grad += local_derivative * node.grad` on every edge.

Three choices differ from the classic closure-based engine (micrograd), and all are about scale:
- No closures, so no cycles. A `_backward` closure that captures its own output node turns every graph into a
  reference cycle that only Python's cyclic garbage collector can free. Here a node points only to its inputs:
  the graph is a DAG that reference counting frees as soon as the loss is dropped (see `collector_paused`).
- One small object per node: `__slots__`, floats for the local derivatives, and a Python number operand kept as
  a constant rather than wrapped in a node of its own (`x * 2` is one node, as in PyTorch).
- An iterative topological sort, so a chain of 100,000 operations does not hit Python's recursion limit.
"""
import contextlib
import gc
import math


class Value:
    """A scalar, its gradient, and the edges back to (at most two) values it was computed from."""

    __slots__ = ("data", "grad", "_a", "_da", "_b", "_db")

    def __init__(self, data, _a=None, _da=0.0, _b=None, _db=0.0):
        self.data = data
        self.grad = 0.0
        self._a, self._da = _a, _da  # first input and d(self)/d(input)
        self._b, self._db = _b, _db  # second input (binary ops only)

    def __repr__(self):
        return f"Value(data={self.data:.6g}, grad={self.grad:.6g})"

    # --- arithmetic: the local derivatives are the whole story ---------------------------------------------
    def __add__(self, other):
        if isinstance(other, Value):
            return Value(self.data + other.data, self, 1.0, other, 1.0)
        return Value(self.data + float(other), self, 1.0)  # a number is a constant: no node, no gradient

    def __sub__(self, other):
        if isinstance(other, Value):
            return Value(self.data - other.data, self, 1.0, other, -1.0)
        return Value(self.data - float(other), self, 1.0)

    def __mul__(self, other):
        if isinstance(other, Value):  # d(ab)/da = b and d(ab)/db = a: each input's local derivative is the other
            return Value(self.data * other.data, self, other.data, other, self.data)
        return Value(self.data * float(other), self, float(other))

    def __truediv__(self, other):
        if isinstance(other, Value):
            return Value(self.data / other.data, self, 1.0 / other.data, other, -self.data / other.data**2)
        return Value(self.data / float(other), self, 1.0 / float(other))

    def __pow__(self, k):
        if not isinstance(k, (int, float)):
            raise TypeError(f"Value ** {type(k).__name__}: only a constant int/float exponent is supported")
        x = self.data
        if (x < 0 and k != int(k)) or (x == 0 and k < 0):  # Python would return a complex number or raise
            raise ValueError(f"{x!r} ** {k!r} has no real value")
        # d(x**k)/dx = k * x**(k-1); it is 0 for k = 0 and, as in torch, infinite at x = 0 when 0 < k < 1
        local = 0.0 if k == 0 else math.inf if x == 0 and k < 1 else k * x ** (k - 1)
        return Value(x**k, self, local)

    def __neg__(self):
        return Value(-self.data, self, -1.0)

    # reflected forms, so that `2 * x`, `1 - x`, `1 / x` and `sum([...])` work
    __radd__ = __add__
    __rmul__ = __mul__

    def __rsub__(self, other):
        return Value(float(other) - self.data, self, -1.0)

    def __rtruediv__(self, other):
        return Value(float(other) / self.data, self, -float(other) / self.data**2)

    # --- unary functions --------------------------------------------------------------------------------------
    def tanh(self):
        t = math.tanh(self.data)
        return Value(t, self, 1.0 - t * t)

    def relu(self):
        return Value(self.data, self, 1.0) if self.data > 0 else Value(0.0, self, 0.0)

    def exp(self):
        e = math.exp(self.data)
        return Value(e, self, e)

    def log(self):
        if self.data <= 0:
            raise ValueError(f"log of a non-positive value {self.data!r}")
        return Value(math.log(self.data), self, 1.0 / self.data)

    # --- backpropagation ------------------------------------------------------------------------------------
    def backward(self):
        """Add d(self)/d(leaf) to every leaf's `.grad` (accumulating across calls, like PyTorch: zero them between
        steps). Intermediate nodes restart from 0 on each call, so a second call adds exactly the same again."""
        order = topological_order(self)
        for node in order:
            if node._a is not None:  # not a leaf
                node.grad = 0.0
        self.grad += 1.0  # dL/dL
        for node in reversed(order):  # a node's grad is complete before it is passed on
            propagate(node)


def propagate(node):
    """The chain rule on one node: hand `node.grad` to its inputs, scaled by the local derivatives."""
    if node._a is not None:
        node._a.grad += node._da * node.grad  # += : a value used twice receives both contributions
        if node._b is not None:
            node._b.grad += node._db * node.grad


def topological_order(root):
    """Every Value reachable from `root`, each listed after its inputs (iterative depth-first search)."""
    order, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if node is None:  # a marker: everything pushed above it (the node's inputs) is listed, so list the node
            order.append(stack.pop())
        elif node not in seen:
            seen.add(node)
            stack.append(node)
            stack.append(None)
            if node._a is not None:
                stack.append(node._a)
                if node._b is not None:
                    stack.append(node._b)
    return order


@contextlib.contextmanager
def collector_paused():
    """Pause Python's cyclic garbage collector, e.g. for one training step. Reference counting still frees every
    graph of this engine (they have no cycles); the collector would only re-scan live nodes and find nothing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

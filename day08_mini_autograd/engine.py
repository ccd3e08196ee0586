"""A scalar autograd engine: every number remembers how it was made, so `backward()` can apply the chain rule.

Each `Value` keeps up to two inputs (`_a`, `_b`) and the local derivative of itself with respect to each
(`_da`, `_db`), computed once in the forward pass. `backward()` orders the graph topologically and walks it in
reverse, doing `input.grad += local_derivative * node.grad` on every edge.

Two choices differ from the classic closure-based engine, and both are about scale:
- No closures. A `_backward` closure that captures its own output node turns every graph into a reference
  cycle that only Python's cyclic garbage collector can free (slowly, and memory piles up meanwhile). Here a
  node points only to its inputs, so the graph is a DAG that reference counting frees as soon as the loss is
  dropped. (Storing plain slots instead of tuples also means one tracked object per node instead of three.)
- An iterative topological sort, so a chain of 100,000 operations does not hit Python's recursion limit.
"""
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

    # --- binary operations: the local derivatives are the whole story -------------------------------------
    def __add__(self, other):
        other = _as_value(other)
        return Value(self.data + other.data, self, 1.0, other, 1.0)

    def __sub__(self, other):
        other = _as_value(other)
        return Value(self.data - other.data, self, 1.0, other, -1.0)

    def __mul__(self, other):
        other = _as_value(other)  # d(ab)/da = b and d(ab)/db = a: each input's local derivative is the other
        return Value(self.data * other.data, self, other.data, other, self.data)

    def __truediv__(self, other):
        other = _as_value(other)
        return Value(self.data / other.data, self, 1.0 / other.data, other, -self.data / other.data**2)

    def __pow__(self, k):
        if not isinstance(k, (int, float)):
            raise TypeError(f"Value ** {type(k).__name__}: only a constant int/float exponent is supported")
        return Value(self.data**k, self, k * self.data ** (k - 1))

    # --- reflected forms, so that `2 * x`, `1 - x`, `1 / x` and `sum([...])` work ---------------------------
    def __neg__(self):
        return Value(-self.data, self, -1.0)

    def __radd__(self, other):
        return self + other

    def __rsub__(self, other):
        return _as_value(other) - self

    def __rmul__(self, other):
        return self * other

    def __rtruediv__(self, other):
        return _as_value(other) / self

    # --- unary functions --------------------------------------------------------------------------------------
    def tanh(self):
        t = math.tanh(self.data)
        return Value(t, self, 1.0 - t * t)

    def relu(self):
        positive = self.data > 0
        return Value(self.data if positive else 0.0, self, 1.0 if positive else 0.0)

    def exp(self):
        e = math.exp(self.data)
        return Value(e, self, e)

    def log(self):
        if self.data <= 0:
            raise ValueError(f"log of a non-positive value {self.data!r}")
        return Value(math.log(self.data), self, 1.0 / self.data)

    # --- backpropagation ------------------------------------------------------------------------------------
    def backward(self):
        """Add d(self)/d(v) to `v.grad` for every Value `v` this one depends on (accumulating, like PyTorch)."""
        self.grad = 1.0  # dL/dL
        for node in reversed(topological_order(self)):  # a node's grad is complete before it is passed on
            propagate(node)


def _as_value(x):
    return x if isinstance(x, Value) else Value(float(x))


def propagate(node):
    """The chain rule on one node: hand `node.grad` to its inputs, scaled by the local derivatives."""
    if node._a is not None:
        node._a.grad += node._da * node.grad  # += : a value used twice receives both contributions
    if node._b is not None:
        node._b.grad += node._db * node.grad


def topological_order(root):
    """Every Value reachable from `root`, each listed after its inputs (iterative depth-first search)."""
    order, seen, stack = [], {root}, [root]
    while stack:
        node = stack[-1]
        if node._a is not None and node._a not in seen:  # descend into the first unvisited input ...
            seen.add(node._a)
            stack.append(node._a)
        elif node._b is not None and node._b not in seen:
            seen.add(node._b)
            stack.append(node._b)
        else:  # ... and emit the node once all of its inputs have been emitted
            order.append(stack.pop())
    return order

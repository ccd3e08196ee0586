"""The scalar engine lifted to NumPy arrays: a `Tensor` with broadcasting, a `Module`/`Linear` wrapper, SGD and Adam.

Same idea as `engine.py`, with arrays instead of floats:
- each result keeps `_parents`, a tuple of `(input, vjp)` pairs; `vjp(out_grad)` returns the gradient for that
  input (a vector-Jacobian product: for elementwise ops just `out_grad * local_derivative`);
- broadcasting copies an input along some axes in the forward pass, so backward sums the gradient back over
  those axes (`_unbroadcast`) — exactly what `torch.autograd` does;
- the vjp closures capture the inputs, never the output, so graphs stay acyclic and free themselves.
Only inputs that require a gradient get an edge, and nothing is recorded under `no_grad()`.
"""
import contextlib
import math

import numpy as np

_grad_enabled = True


@contextlib.contextmanager
def no_grad():
    """Build no graph inside the block (evaluation), like `torch.no_grad()`."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


class Tensor:
    __array_ufunc__ = None  # `ndarray + Tensor`, `ndarray @ Tensor`: NumPy hands the operation to Tensor

    def __init__(self, data, requires_grad=False):
        data = np.array(data)  # a copy, like torch.tensor(): an optimizer step never writes into the caller's array
        self.data = data if np.issubdtype(data.dtype, np.floating) else data.astype(np.float64)
        self.requires_grad = requires_grad
        self.grad = None
        self._parents = ()

    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)

    def __repr__(self):
        return f"Tensor(shape={self.shape}, dtype={self.data.dtype}, requires_grad={self.requires_grad})"

    def _const(self, x):
        """Wrap a Python number or array in this tensor's dtype (so float32 math stays float32)."""
        return x if isinstance(x, Tensor) else Tensor(np.asarray(x, dtype=self.data.dtype))

    # --- elementwise arithmetic (broadcasting) ----------------------------------------------------------------
    def __add__(self, other):
        other = self._const(other)
        return _result(self.data + other.data, (self, lambda g: g), (other, lambda g: g))

    def __sub__(self, other):
        other = self._const(other)
        return _result(self.data - other.data, (self, lambda g: g), (other, lambda g: -g))

    def __mul__(self, other):
        other = self._const(other)
        return _result(self.data * other.data, (self, lambda g: g * other.data), (other, lambda g: g * self.data))

    def __truediv__(self, other):
        other = self._const(other)
        return _result(self.data / other.data, (self, lambda g: g / other.data),
                       (other, lambda g: -g * self.data / other.data**2))

    def __pow__(self, k):
        if not isinstance(k, (int, float)):
            raise TypeError(f"Tensor ** {type(k).__name__}: only a constant int/float exponent is supported")
        return _result(self.data**k, (self, lambda g: g * k * self.data ** (k - 1)))

    def __neg__(self):
        return _result(-self.data, (self, lambda g: -g))

    def __radd__(self, other):
        return self + other

    def __rsub__(self, other):
        return self._const(other) - self

    def __rmul__(self, other):
        return self * other

    def __rtruediv__(self, other):
        return self._const(other) / self

    # --- elementwise functions ----------------------------------------------------------------------------
    def relu(self):
        mask = self.data > 0
        return _result(self.data * mask, (self, lambda g: g * mask))

    def tanh(self):
        t = np.tanh(self.data)
        return _result(t, (self, lambda g: g * (1 - t * t)))

    def exp(self):
        e = np.exp(self.data)
        return _result(e, (self, lambda g: g * e))

    def log(self):
        return _result(np.log(self.data), (self, lambda g: g / self.data))

    # --- shapes, reductions, matmul ---------------------------------------------------------------------------
    def reshape(self, *shape):
        return _result(self.data.reshape(*shape), (self, lambda g: g.reshape(self.shape)))

    def sum(self, axis=None, keepdims=False):
        def vjp(g):  # every summed element receives the gradient of the sum: re-insert the axes, then broadcast
            if axis is not None and not keepdims:
                g = np.expand_dims(g, axis)
            return np.broadcast_to(g, self.shape)

        return _result(self.data.sum(axis=axis, keepdims=keepdims), (self, vjp))

    def mean(self, axis=None, keepdims=False):
        total = self.sum(axis=axis, keepdims=keepdims)
        return total * (total.data.size / self.data.size)

    def __matmul__(self, other):
        other = self._const(other)
        if self.data.ndim != 2 or other.data.ndim != 2 or self.shape[1] != other.shape[0]:
            raise ValueError(f"matmul needs 2-D (n, k) @ (k, m); got {self.shape} @ {other.shape}")
        return _result(self.data @ other.data, (self, lambda g: g @ other.data.T), (other, lambda g: self.data.T @ g))

    def __rmatmul__(self, other):
        return self._const(other) @ self

    def log_softmax(self, axis=-1):
        """x - logsumexp(x), computed after subtracting the max so exp() cannot overflow."""
        shifted = self.data - self.data.max(axis=axis, keepdims=True)
        out = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
        softmax = np.exp(out)
        return _result(out, (self, lambda g: g - softmax * g.sum(axis=axis, keepdims=True)))

    # --- backpropagation ------------------------------------------------------------------------------------
    def backward(self):
        """Accumulate d(self)/d(leaf) into every leaf's `.grad`; intermediate gradients are dropped once used."""
        if self.data.size != 1:
            raise ValueError(f"backward() needs a scalar (one-element) tensor, got shape {self.shape}")
        self.grad = np.ones_like(self.data)
        for node in reversed(topological_order(self)):
            for parent, vjp in node._parents:
                g = _unbroadcast(vjp(node.grad), parent.shape)
                if parent._parents:  # an intermediate result: its gradient is read once, then dropped
                    parent.grad = g if parent.grad is None else parent.grad + g
                elif parent.grad is None:  # a leaf: a gradient of its own (`g` may be shared or read-only)
                    parent.grad = g.astype(parent.data.dtype)
                else:
                    parent.grad += g  # accumulates across backward() calls, like PyTorch
            if node._parents:
                node.grad = None  # like PyTorch, only leaves keep .grad (frees memory during backward)


def _result(data, *edges):
    """A new Tensor around a fresh result (no copy) with an edge to each input that needs a gradient (none under
    `no_grad()`)."""
    out = Tensor.__new__(Tensor)
    out.data, out.grad = np.asarray(data), None
    out._parents = tuple(e for e in edges if e[0].requires_grad) if _grad_enabled else ()
    out.requires_grad = bool(out._parents)
    return out


def _unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added or stretched, so it matches the input's `shape`."""
    grad = grad.sum(axis=tuple(range(grad.ndim - len(shape)))) if grad.ndim > len(shape) else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True) if stretched else grad


def topological_order(root):
    """Every Tensor reachable from `root`, each after its inputs (iterative depth-first search)."""
    order, seen, stack = [], {root}, [(root, iter(root._parents))]
    while stack:
        node, edges = stack[-1]
        for parent, _ in edges:  # resume this node's inputs where we left off
            if parent not in seen:
                seen.add(parent)
                stack.append((parent, iter(parent._parents)))
                break
        else:
            order.append(node)
            stack.pop()
    return order


def cross_entropy(logits, targets):
    """Mean negative log-likelihood of integer `targets` (N,) under `logits` (N, C)."""
    targets = np.asarray(targets)
    n, num_classes = logits.shape
    if targets.shape != (n,) or targets.min() < 0 or targets.max() >= num_classes:
        raise ValueError(f"targets must be shape ({n},) with values in [0, {num_classes}); "
                         f"got shape {targets.shape}, range [{targets.min()}, {targets.max()}]")
    one_hot = np.zeros(logits.shape, dtype=logits.data.dtype)
    one_hot[np.arange(n), targets] = 1.0
    return (logits.log_softmax(axis=1) * one_hot).sum() * (-1.0 / n)


# --- modules ---------------------------------------------------------------------------------------------------
class Module:
    """Finds parameters by walking attributes, like `torch.nn.Module` does with registered submodules."""

    def parameters(self):
        found = []
        for value in vars(self).values():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, Module):
                    found += item.parameters()
                elif isinstance(item, Tensor) and item.requires_grad:
                    found.append(item)
        return found

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def __call__(self, *args):
        return self.forward(*args)


class Linear(Module):
    """y = x W + b with PyTorch's default init range U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""

    def __init__(self, n_in, n_out, rng, dtype=np.float32):
        bound = 1.0 / np.sqrt(n_in)
        self.weight = Tensor(rng.uniform(-bound, bound, (n_in, n_out)).astype(dtype), requires_grad=True)
        self.bias = Tensor(rng.uniform(-bound, bound, (n_out,)).astype(dtype), requires_grad=True)

    def forward(self, x):
        return x @ self.weight + self.bias


class MLP(Module):
    """Linear layers with ReLU in between; returns logits (cross_entropy applies the log-softmax)."""

    def __init__(self, sizes, seed=0, dtype=np.float32):
        rng = np.random.default_rng(seed)
        self.layers = [Linear(n_in, n_out, rng, dtype) for n_in, n_out in zip(sizes[:-1], sizes[1:])]

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = layer(x).relu()
        return self.layers[-1](x)


# --- optimizers ------------------------------------------------------------------------------------------------
class Optimizer:
    def __init__(self, params, lr):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None


class SGD(Optimizer):
    def step(self):
        for p in self.params:
            if p.grad is not None:
                p.data -= self.lr * p.grad


class Adam(Optimizer):
    """Adam with bias correction, the same update as `torch.optim.Adam` (L2 `weight_decay` added to the grad)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr)
        self.betas, self.eps, self.weight_decay, self.t = betas, eps, weight_decay, 0
        self.m = [np.zeros_like(p.data) for p in self.params]  # running mean of gradients
        self.v = [np.zeros_like(p.data) for p in self.params]  # running mean of squared gradients

    def step(self):
        self.t += 1
        b1, b2 = self.betas
        correction1, correction2 = 1 - b1**self.t, 1 - b2**self.t  # early averages are biased toward 0
        for p, m, v in zip(self.params, self.m, self.v):
            if p.grad is None:
                continue
            g = p.grad + self.weight_decay * p.data if self.weight_decay else p.grad
            m += (1 - b1) * (g - m)  # m = b1*m + (1-b1)*g, in place (same lerp form as torch)
            v *= b2
            v += (1 - b2) * g * g
            denom = np.sqrt(v) / math.sqrt(correction2) + self.eps  # math.sqrt: a NumPy float64 would upcast float32
            p.data -= (self.lr / correction1) * m / denom

"""Neurons, layers and an MLP built from the scalar engine's `Value`s (micrograd's `nn.py`, in one class)."""
import random

from day08_mini_autograd.engine import Value


class MLP:
    """Layers of scalar neurons `act(w . x + b)`; the last layer is linear unless `act_last`."""

    def __init__(self, n_in, sizes, act="relu", act_last=False, seed=0):
        if act not in ("relu", "tanh"):
            raise ValueError(f"unknown activation {act!r}; use 'relu' or 'tanh'")
        rng = random.Random(seed)
        dims = [n_in, *sizes]
        # layers[l][j] = [w_1, ..., w_n, b] of neuron j in layer l
        self.layers = [[[Value(rng.uniform(-1, 1)) for _ in range(fan_in)] + [Value(0.0)] for _ in range(fan_out)]
                       for fan_in, fan_out in zip(dims[:-1], dims[1:])]
        self.act, self.act_last = act, act_last

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            activate = i < len(self.layers) - 1 or self.act_last
            x = [self._neuron(neuron, x, activate) for neuron in layer]
        return x

    def _neuron(self, neuron, x, activate):
        z = neuron[-1]  # the bias, then + w_i * x_i (zip stops at the shorter x, so the bias is not paired)
        for w, xi in zip(neuron, x):
            z = z + w * xi
        return (z.relu() if self.act == "relu" else z.tanh()) if activate else z

    def parameters(self):
        return [p for layer in self.layers for neuron in layer for p in neuron]

    def zero_grad(self):
        for p in self.parameters():
            p.grad = 0.0

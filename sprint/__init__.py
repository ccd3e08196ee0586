"""The few helpers every day would otherwise copy: offline MNIST, device choice, gate recording."""

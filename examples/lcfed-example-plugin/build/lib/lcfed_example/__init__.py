"""An lcfed plugin package: a method (FedProx), a model (an MLP) and a dataset (arrays in an .npz file)."""

"""Target implementations behind ``specbench.decoding.target.Target``: transformers wherever it was placed."""

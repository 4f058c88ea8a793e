"""Reading specbench run directories for tables, fits and figures."""

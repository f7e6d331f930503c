"""What the notebooks are made of: the papers' claims and numbers, the benchmark protocol of notebook
06, figures for print, the explorer, and a notebook's header and tables."""

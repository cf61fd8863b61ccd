"""sparse-circuits' addition toy (the paper's Figure 1 setting, our illustration): model.py, the toy transformer and
its addition data; run.py, its training, sparse post-training and measurements (called by the study's recipe);
analysis.py, its claims (all ours), verdict and figures (called by the study's analysis)."""

"""Model runners: the only code in localinfer that imports a framework (torch, mlx, llama_cpp).

Installed as ``localinfer.backends`` through a package-dir mapping; always import it by that name.
"""

"""Storage: every path, the locks on output directories, and the data commands' resumable outputs."""

"""The hot path's two implementations behind one switch: the Rust core and its Python
reference (`reference`), selected by `backend.load_backend`."""

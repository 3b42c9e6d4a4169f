"""The only code that talks to llama-cpp-python (ctypes). Everything else sees plain Python."""

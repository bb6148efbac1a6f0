"""A workflow module that fails to import, for the runtime's error tests."""

raise RuntimeError("this module is broken on purpose")

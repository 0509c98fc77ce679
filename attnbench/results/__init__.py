"""Results on disk: the writer, the loader, the loaded run, and the environment a run records.

Import from the modules: ``results.store`` (writer, loader), ``results.run`` (``RunResults``),
``results.files`` (file names, atomic writes, folders), ``results.environment``.
"""

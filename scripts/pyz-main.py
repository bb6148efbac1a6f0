# The zipapp's __main__.py (scripts/build-pyz puts it in place of shiv's):
# shiv's bootstrap, reading the archive through the importer Python opened
# for it.
#
# Python parses the archive's directory, thousands of entries, to find this
# file. shiv's bootstrap then opens the archive with `zipfile` to read one
# small file, environment.json, and so parses the whole directory again:
# some 20 ms of every start. Here that file is read through Python's
# importer, and the archive is opened with `zipfile` only when shiv
# extracts its packages: the first start of a build in a SHIV_ROOT.
import contextlib
import sys
import zipfile
import zipimport

import _bootstrap


class Archive:
    """The running archive as shiv's bootstrap uses it: its file name, a
    member read through the importer, and anything else (the extraction's
    `infolist`, `extract`) from a `zipfile.ZipFile` opened on first use."""

    def __init__(self, importer):
        self.filename = sys.argv[0]  # as shiv names it: its SHIV_ROOT entry is named after it
        self._importer = importer
        self._zipfile = None

    def read(self, name):
        return self._importer.get_data(name)

    def __getattr__(self, name):
        if self._zipfile is None:
            self._zipfile = zipfile.ZipFile(self.filename)
        return getattr(self._zipfile, name)

    def close(self):
        if self._zipfile is not None:
            self._zipfile.close()


@contextlib.contextmanager
def current_zipfile():
    archive = Archive(__loader__)
    try:
        yield archive
    finally:
        archive.close()


# Python imports this file from the archive through a zipimporter; run from
# an unzipped copy instead, it leaves shiv's bootstrap as shiv wrote it.
if isinstance(__loader__, zipimport.zipimporter):
    _bootstrap.current_zipfile = current_zipfile
_bootstrap.bootstrap()

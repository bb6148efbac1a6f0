"""The ``everystep`` command line: the zipapp's entry point and the console
script of the installed package."""

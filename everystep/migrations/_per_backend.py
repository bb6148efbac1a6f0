"""The migrations' way to run different SQL on each backend (a module whose
name starts with an underscore is not a migration)."""


def run_for_backend(statements):
    """A `RunPython` function that executes ``statements[vendor]``, the list
    of SQL statements for the migrating connection's backend (none if the
    backend is not listed)."""

    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run

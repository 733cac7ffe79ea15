"""The package's version, on its own: ``localcluster.__version__``, pyproject.toml and the report
read it here, so that nothing below the package has to import the package itself."""
__version__ = "0.1.0"

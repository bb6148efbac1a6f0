"""The standalone configuration: environment parsing and Django settings for
running everystep without a Django project of one's own."""

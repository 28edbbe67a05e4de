from flotilla.cli import app

app()

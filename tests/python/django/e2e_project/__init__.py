"""A small Django project the end-to-end tests serve under gunicorn (WSGI) and uvicorn (ASGI).

Its configuration comes from ``E2E_*`` environment variables set by the test that starts the
server, so one project serves every case (see ``settings.py``).
"""

"""Small helpers shared by the study tests."""


def interrupt_on_call(monkeypatch, module, name: str, n: int, exc: type[BaseException] = KeyboardInterrupt):
    """Replace module.name by a wrapper that raises `exc` on its n-th call (a run killed mid-way)."""
    real = getattr(module, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise exc()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return real

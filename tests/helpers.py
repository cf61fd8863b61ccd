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


def run_at_once(commands: list[list[str]], env: dict, timeout: float = 600) -> list:
    """Run the commands as processes side by side (a one-process reference beside a two-process launch: with one
    thread each they share the machine's cores instead of waiting for each other); each one's (returncode,
    stdout, stderr), in order. A command still running at `timeout` is killed and fails."""
    import subprocess
    from types import SimpleNamespace

    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in commands]
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out.append(SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=stderr))
    return out

"""Max errors recorded by the tests (printed by run.py)."""
RECORDED: dict = {}


def record(key: str, value: float) -> None:
    RECORDED[key] = max(float(value), RECORDED.get(key, 0.0))

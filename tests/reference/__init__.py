"""An independent per-token model of one replica, written from the specification
("A replica, precisely" in ``docs/model.md``) alone; the engine's tests use it as truth."""

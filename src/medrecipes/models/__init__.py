"""Models: loading (Hub id, folder, .gguf, scratch preset), the files a local model needs, chat
templates, and tiny models for tests and the demo."""

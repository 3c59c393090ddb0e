"""Chatfleet operator: reconciles ChatbotService objects onto NVIDIA Triton GPU workloads."""

__version__ = "0.1.0"

"""Progress bars, and later HTML reprs and a dashboard."""

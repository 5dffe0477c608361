"""How an analysis is shown: the text summary, plotly figures, the wire protocol, the
widget and its static fallback, and a checkpoint's views.
"""

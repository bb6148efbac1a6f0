"""Template filters of the operator UI."""

from django import template

from everystep.core.serde import readable_json

register = template.Library()


@register.filter
def pretty(value):
    """A decoded value as indented JSON, for a person to read."""
    return readable_json(value, indent=2, ensure_ascii=False)


@register.filter
def seconds(value):
    """A duration in seconds, shortly: 12 ms, 3.4 s, 5 min 2 s."""
    if value is None:
        return ""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, rest = divmod(int(value), 60)
    return f"{minutes} min {rest} s"

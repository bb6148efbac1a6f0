"""`Workflow` and `Step` in the Django admin, read-only: runs change only
through the engine and the operator actions, which keep their guarantees."""

from django.contrib import admin

from everystep.models import Step, Workflow


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Workflow)
class WorkflowAdmin(ReadOnly):
    list_display = ("id", "name", "status", "claimed_by", "created_at", "completed_at")
    list_filter = ("status", "name")
    search_fields = ("=id", "=idempotency_key")
    ordering = ("-id",)
    show_full_result_count = False


@admin.register(Step)
class StepAdmin(ReadOnly):
    list_display = ("workflow_id", "step_id", "name", "status", "started_at", "finished_at")
    list_filter = ("status", "workflow__name")
    ordering = ("-id",)
    show_full_result_count = False

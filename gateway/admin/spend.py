"""The spend admin routes: `/admin/spend` for the gateway's agents (`policy.spend`)."""

from __future__ import annotations

from aiohttp import web

from gateway.admin.access import AdminAccess, AdminBody, RoomKey
from gateway.admin.api import admin_route
from gateway.admin.service import AdminAck, AdminService
from gateway.state.base import AuditStore


class SpendRoomQuery(AdminBody):
    """`GET /admin/spend?room=`: the spend of one room's agents."""

    room: RoomKey


def spend_routes(admin: AdminService, state: AuditStore, access: AdminAccess) -> list[web.RouteDef]:
    """`GET /admin/spend?room=`, with the admin API's auth and audit."""

    async def show(query: SpendRoomQuery) -> AdminAck:
        return await admin.spend(query.room)

    return [admin_route(admin, state, access, ("GET", "/admin/spend", SpendRoomQuery, show))]

-- Argo CD health check for ChatbotService (chatfleet.io/v1alpha1).
-- Install: argocd-cm key resource.customizations.health.chatfleet.io_ChatbotService (docs/gitops.md).
-- Reads only status facts the operator writes (conditions, observedGeneration, revisions, abortReason),
-- in this order: not yet observed -> stalled -> rolled back -> degraded -> paused -> ready -> in progress.
local hs = {}

local function conditions(status)
  local byType = {}
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      byType[c.type] = c
    end
  end
  return byType
end

local function describe(c)
  if c == nil then
    return ""
  end
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator's status of generation " .. tostring(generation)
  return hs
end

local c = conditions(status)

if c.Stalled ~= nil and c.Stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(c.Stalled)
  return hs
end

-- A rolled-back release leaves the spec asking for a revision that is not served.
if status.abortReason ~= nil and status.abortReason ~= "" and status.updateRevision ~= nil
    and status.updateRevision ~= status.stableRevision then
  hs.status = "Degraded"
  hs.message = "Release rolled back: " .. status.abortReason
  return hs
end

if c.Degraded ~= nil and c.Degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(c.Degraded)
  return hs
end

local reconciling = c.Reconciling ~= nil and c.Reconciling.status == "True"
local releasing = status.canaryRevision ~= nil and status.canaryRevision ~= ""

-- A release paused by hand (`kubectl chatbot pause` sets spec.rollout.paused) waits for a person.
if obj.spec ~= nil and obj.spec.rollout ~= nil and obj.spec.rollout.paused == true and (releasing or reconciling) then
  hs.status = "Suspended"
  hs.message = "Release paused (spec.rollout.paused): `kubectl chatbot resume` continues it"
  return hs
end
if c.Ready ~= nil and c.Ready.status == "True" and not reconciling then
  hs.status = "Healthy"
  hs.message = describe(c.Ready)
  return hs
end

hs.status = "Progressing"
if releasing then
  hs.message = "Canary " .. status.canaryRevision .. " at " .. tostring(status.canaryWeight or 0) .. "% of traffic"
elseif reconciling then
  hs.message = describe(c.Reconciling)
else
  hs.message = describe(c.Ready)
end
return hs
